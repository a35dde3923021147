// C++ side of include/hlo_api.h: wraps the cxx bridge of src/lib.rs, turning
// rust::Error into HloError and HloError into Status.
#include "xla/cc_api/include/hlo_api.h"

#include <utility>

#include "rust/cxx.h"
#include "xla/cc_api/src/lib.rs.h"

namespace xla_rs {

struct HloModule::Impl {
  explicit Impl(rust::Box<ffi::Module> m) : module(std::move(m)) {}
  rust::Box<ffi::Module> module;
};

namespace {

rust::Str ToStr(std::string_view s) { return rust::Str(s.data(), s.size()); }

template <typename F>
auto Translate(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const rust::Error& e) {
    throw HloError(e.what());
  }
}

template <typename F>
Status Catch(F&& f) {
  try {
    f();
    return Status();
  } catch (const std::exception& e) {
    return Status::Error(e.what());
  }
}

}  // namespace

HloModule::HloModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HloModule::HloModule(const HloModule& other)
    : impl_(std::make_unique<Impl>(ffi::clone_module(*other.impl_->module))) {}
HloModule& HloModule::operator=(const HloModule& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(ffi::clone_module(*other.impl_->module));
  return *this;
}
HloModule::HloModule(HloModule&& other) noexcept = default;
HloModule& HloModule::operator=(HloModule&& other) noexcept = default;
HloModule::~HloModule() = default;

HloModule HloModule::Parse(std::string_view text) {
  return Translate([&] { return HloModule(std::make_unique<Impl>(ffi::parse_module(ToStr(text)))); });
}

std::string HloModule::name() const { return std::string(ffi::module_name(*impl_->module)); }

void HloModule::Verify() const {
  Translate([&] { ffi::verify_module(*impl_->module); });
}

std::string HloModule::ToString() const { return std::string(ffi::module_to_text(*impl_->module)); }

ModuleStats HloModule::Stats() const {
  ffi::Stats s = ffi::module_stats(*impl_->module);
  ModuleStats out;
  out.instructions = static_cast<int64_t>(s.instructions);
  out.computations = static_cast<int64_t>(s.computations);
  out.collectives = static_cast<int64_t>(s.collectives);
  out.collective_bytes = static_cast<int64_t>(s.collective_bytes);
  out.json = std::string(s.json);
  return out;
}

std::vector<PassRun> HloModule::RunPasses(std::string_view passes) {
  return Translate([&] {
    std::vector<PassRun> out;
    for (const ffi::PassRunInfo& r : ffi::run_passes(*impl_->module, ToStr(passes))) {
      out.push_back(PassRun{std::string(r.name), r.changed});
    }
    return out;
  });
}

std::vector<std::string> AvailablePasses() {
  std::vector<std::string> out;
  for (const rust::String& s : ffi::available_passes()) out.emplace_back(s);
  return out;
}

bool InitLogging(std::string_view filter) {
  return ffi::init_logging(ToStr(filter));
}

Status ParseHloModule(std::string_view text, std::unique_ptr<HloModule>* out) {
  return Catch([&] { *out = std::make_unique<HloModule>(HloModule::Parse(text)); });
}

Status VerifyHloModule(const HloModule& module) {
  return Catch([&] { module.Verify(); });
}

Status RunPasses(HloModule& module, std::string_view passes, std::vector<PassRun>* runs) {
  return Catch([&] {
    std::vector<PassRun> r = module.RunPasses(passes);
    if (runs != nullptr) *runs = std::move(r);
  });
}

}  // namespace xla_rs
