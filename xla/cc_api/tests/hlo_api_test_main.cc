// main() of the Bazel cc_test //xla/cc_api:hlo_api_cc_test.
extern "C" int xla_cc_api_run_tests();

int main() { return xla_cc_api_run_tests() == 0 ? 0 : 1; }
