// C++ API of xla-rs: parse, verify, print and summarise HLO modules and run
// passes on them by name, from C++ code in an XLA-style codebase.
//
// Text in, text and statistics out. Two error styles:
//   * exceptions: HloModule's functions throw xla_rs::HloError (a
//     std::runtime_error whose what() is the message, e.g. "parse error:
//     3:12: expected ...");
//   * status: the free functions return xla_rs::Status (ok() / message()),
//     like absl::Status, and never throw.
//
// Passes are run through one function with a comma-separated list, e.g.
//   RunPasses(module, "sharding-propagation,spmd-partitioning");
// A pass this build does not have yet (or an unknown name) is an error that
// lists the available passes; AvailablePasses() lists them too. On any error
// the module is left unchanged.
//
// Logging: the Rust side logs through Rust's `log` facade (each pass's time
// at info, the scheduler's warnings at warn). Nothing is printed until the
// program calls InitLogging() once; from then on messages go to stderr,
// filtered by the RUST_LOG environment variable as in hlo-opt and
// run_hlo_module (e.g. RUST_LOG=info), or by InitLogging's argument when
// RUST_LOG is unset.
//
// Build: Bazel `//xla/cc_api:hlo_api` (cc_library); cargo builds the same
// sources through cxx-build (xla/cc_api/build.rs).
#ifndef XLA_CC_API_INCLUDE_HLO_API_H_
#define XLA_CC_API_INCLUDE_HLO_API_H_

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace xla_rs {

namespace ffi {
struct Module;
}  // namespace ffi

// The exception HloModule's functions throw.
class HloError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Result of the non-throwing functions.
class Status {
 public:
  Status() = default;  // OK
  static Status Error(std::string message) { return Status(std::move(message)); }
  bool ok() const { return !error_; }
  // Empty when ok().
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : error_(true), message_(std::move(message)) {}
  bool error_ = false;
  std::string message_;
};

// Static statistics of a module (what `hlo-opt --stats` prints).
struct ModuleStats {
  int64_t instructions = 0;
  int64_t computations = 0;
  int64_t collectives = 0;       // async starts count as their collective
  int64_t collective_bytes = 0;  // per device
  std::string json;              // all of it as one JSON object
};

// One pass run by RunPasses, in order.
struct PassRun {
  std::string name;
  bool changed = false;
};

class HloModule {
 public:
  // Parses HLO text (as XLA prints it). Throws HloError.
  static HloModule Parse(std::string_view text);

  HloModule(const HloModule& other);
  HloModule& operator=(const HloModule& other);
  HloModule(HloModule&& other) noexcept;
  HloModule& operator=(HloModule&& other) noexcept;
  ~HloModule();

  std::string name() const;
  // Runs the HLO verifier. Throws HloError listing every problem.
  void Verify() const;
  // The module as HLO text; Parse(ToString()) gives the same module.
  std::string ToString() const;
  ModuleStats Stats() const;
  // Runs the comma-separated passes in order, verifying after each. Throws
  // HloError (and leaves the module unchanged) on an unavailable pass or a
  // failing one.
  std::vector<PassRun> RunPasses(std::string_view passes);

 private:
  struct Impl;
  explicit HloModule(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The names RunPasses accepts in this build.
std::vector<std::string> AvailablePasses();

// Sends the Rust side's log messages to stderr (see the top of this file);
// `filter` applies when RUST_LOG is unset ("warn", "info", "debug", ...).
// Returns false when logging was already set up in this process.
bool InitLogging(std::string_view filter = "warn");

// Non-throwing forms.
Status ParseHloModule(std::string_view text, std::unique_ptr<HloModule>* out);
Status VerifyHloModule(const HloModule& module);
Status RunPasses(HloModule& module, std::string_view passes,
                 std::vector<PassRun>* runs = nullptr);

}  // namespace xla_rs

#endif  // XLA_CC_API_INCLUDE_HLO_API_H_
