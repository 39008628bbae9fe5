// The attnkit command (commands are added by the CLI modules).
#include <cstdio>

int main(int argc, char** argv) {
  (void)argc;
  (void)argv;
  std::puts("attnkit: no command yet");
  return 0;
}
