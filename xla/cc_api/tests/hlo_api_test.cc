// Tests of the C++ API (include/hlo_api.h), built by both builds:
//   * Bazel: cc_test //xla/cc_api:hlo_api_cc_test (with hlo_api_test_main.cc),
//     and rust_test //xla/cc_api:cc_test (the cargo harness below);
//   * cargo: build.rs compiles this file into its own archive, which
//     tests/cc_test.rs links and calls (`cargo test -p xla-cc-api`).
// Entry point: xla_cc_api_run_tests() returns the number of failed checks.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "xla/cc_api/include/hlo_api.h"

namespace {

int failures = 0;

#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A sharded dot with an all-reduce: something for the passes to work on.
constexpr char kModule[] = R"(HloModule sharded_dot, entry_computation_layout={(f32[8,16]{1,0}, f32[16,4]{1,0})->f32[8,4]{1,0}}, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[8,16], y: f32[16,4]) -> f32[8,4] {
  %x = f32[8,16]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}
  %y = f32[16,4]{1,0} parameter(1), sharding={replicated}
  %d = f32[8,4]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %r = f32[8,4]{1,0} all-reduce(%d), replica_groups={{0,1}}, to_apply=%add
}
)";

void TestParsePrintStats() {
  xla_rs::HloModule m = xla_rs::HloModule::Parse(kModule);
  CHECK(m.name() == "sharded_dot");
  m.Verify();
  std::string text = m.ToString();
  CHECK(Contains(text, "all-reduce("));
  // Printing is stable: parse(print(m)) prints the same text.
  CHECK(xla_rs::HloModule::Parse(text).ToString() == text);
  xla_rs::ModuleStats s = m.Stats();
  CHECK(s.instructions == 7);
  CHECK(s.computations == 2);
  CHECK(s.collectives == 1);
  CHECK(s.collective_bytes == 8 * 4 * 4);
  CHECK(Contains(s.json, "\"all-reduce\":1"));
}

void TestErrorsAsExceptions() {
  bool thrown = false;
  try {
    xla_rs::HloModule::Parse("HloModule m\n\nENTRY %e {\n  ROOT %x = f32[] bogus()\n}\n");
  } catch (const xla_rs::HloError& e) {
    thrown = true;
    CHECK(Contains(e.what(), "parse error: 4:"));
  }
  CHECK(thrown);

  // Parses, but does not verify: the root's shape disagrees with negate's.
  xla_rs::HloModule bad = xla_rs::HloModule::Parse(
      "HloModule m\n\nENTRY %e (p: f32[4]) -> f32[5] {\n  %p = f32[4]{0} parameter(0)\n"
      "  ROOT %n = f32[5]{0} negate(%p)\n}\n");
  thrown = false;
  try {
    bad.Verify();
  } catch (const xla_rs::HloError& e) {
    thrown = true;
    CHECK(Contains(e.what(), "does not verify"));
  }
  CHECK(thrown);
}

void TestErrorsAsStatus() {
  std::unique_ptr<xla_rs::HloModule> m;
  xla_rs::Status st = xla_rs::ParseHloModule("HloModule", &m);
  CHECK(!st.ok());
  CHECK(Contains(st.message(), "parse error"));
  CHECK(m == nullptr);
  st = xla_rs::ParseHloModule(kModule, &m);
  CHECK(st.ok());
  CHECK(m != nullptr && xla_rs::VerifyHloModule(*m).ok());
}

void TestPassesByName() {
  // Once a logger is installed, a second call keeps it.
  xla_rs::InitLogging("warn");
  CHECK(!xla_rs::InitLogging("info"));
  const std::vector<std::string> available = xla_rs::AvailablePasses();
  CHECK((available == std::vector<std::string>{"shardy-import", "sdy-propagation",
                                               "sharding-propagation",
                                               "complete-shardings", "spmd-partitioning",
                                               "windowed-einsum", "decompose-collectives",
                                               "combine-collectives",
                                               "async-collective-creator",
                                               "latency-hiding-scheduler"}));

  // Propagation, then partitioning, then scheduling, through one call.
  xla_rs::HloModule m = xla_rs::HloModule::Parse(kModule);
  std::vector<xla_rs::PassRun> runs;
  xla_rs::Status st =
      xla_rs::RunPasses(m, "sharding-propagation,spmd-partitioning,latency-hiding-scheduler", &runs);
  CHECK(st.ok());
  CHECK(runs.size() == 3 && runs[0].name == "sharding-propagation" && runs[0].changed &&
        runs[1].name == "spmd-partitioning" && runs[2].name == "latency-hiding-scheduler");
  const std::string text = m.ToString();
  CHECK(Contains(text, "is_scheduled=true"));
  CHECK(Contains(text, "%x = f32[4,16]{1,0} parameter(0)"));  // the per-device shard
  CHECK(Contains(text, "-start("));  // the collectives, made async by the scheduler
  CHECK(xla_rs::VerifyHloModule(m).ok());

  // An unknown pass: a clear error listing what exists, and the module unchanged.
  xla_rs::HloModule fresh = xla_rs::HloModule::Parse(kModule);
  const std::string before = fresh.ToString();
  st = xla_rs::RunPasses(fresh, "sharding-propagation,collective-pipeliner");
  CHECK(!st.ok());
  CHECK(Contains(st.message(), "\"collective-pipeliner\" is not a known pass"));
  CHECK(Contains(st.message(), "available: shardy-import, sdy-propagation, sharding-propagation, complete-shardings, spmd-partitioning"));
  CHECK(fresh.ToString() == before);

  bool thrown = false;
  try {
    fresh.RunPasses("no-such-pass");
  } catch (const xla_rs::HloError& e) {
    thrown = true;
    CHECK(Contains(e.what(), "\"no-such-pass\" is not a known pass"));
  }
  CHECK(thrown);
}

void TestCopies() {
  xla_rs::HloModule a = xla_rs::HloModule::Parse(kModule);
  xla_rs::HloModule b = a;  // deep copy
  b.RunPasses("sharding-propagation");
  CHECK(a.ToString() != b.ToString());
  xla_rs::HloModule c = std::move(b);
  CHECK(c.name() == "sharded_dot");
}

}  // namespace

extern "C" int xla_cc_api_run_tests() {
  failures = 0;
  const struct {
    const char* name;
    void (*fn)();
  } tests[] = {
      {"ParsePrintStats", TestParsePrintStats}, {"ErrorsAsExceptions", TestErrorsAsExceptions},
      {"ErrorsAsStatus", TestErrorsAsStatus},   {"PassesByName", TestPassesByName},
      {"Copies", TestCopies},
  };
  int passed = 0, failed = 0;
  for (const auto& t : tests) {
    const int before = failures;
    try {
      t.fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: unexpected exception: %s\n", t.name, e.what());
      ++failures;
    }
    const bool ok = failures == before;
    std::printf("[%s] %s\n", ok ? "  OK  " : " FAIL ", t.name);
    (ok ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed;
}
