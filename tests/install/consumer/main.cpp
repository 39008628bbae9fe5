#include <attnkit/dtype.h>
#include <attnkit/error.h>

#include <cstdio>

int main() {
  // 300 rounds to 288 in e4m3 (RNE between 288 and 320).
  const float back = attnkit::e4m3_to_float(attnkit::float_to_e4m3(300.f));
  try {
    attnkit::parse_dtype("int3");
    return 1;
  } catch (const attnkit::Error&) {
  }
  std::printf("consumer ok %g\n", back);
  return back == 288.f ? 0 : 1;
}
