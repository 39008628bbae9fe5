// attnkit::Error: every rejected input names the value it saw and the rule it broke.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace attnkit {

class Error : public std::runtime_error {
 public:
  // where: the entry point ("write_kv"); value: "slot_mapping[3] = 9000";
  // rule: "a slot must be < num_blocks * block_size = 4096".
  Error(std::string where, std::string value, std::string rule)
      : std::runtime_error(where + ": " + value + " violates: " + rule),
        where_(std::move(where)), value_(std::move(value)), rule_(std::move(rule)) {}
  const std::string& where() const noexcept { return where_; }
  const std::string& value() const noexcept { return value_; }
  const std::string& rule() const noexcept { return rule_; }

 private:
  std::string where_, value_, rule_;
};

namespace detail {
template <class T>
std::string describe(std::string_view name, const T& v) {
  std::ostringstream os;
  os << name << " = " << v;
  return os.str();
}
}  // namespace detail

// Throws Error("where", "name = value", rule).
template <class T>
[[noreturn]] void fail(std::string_view where, std::string_view name, const T& value,
                       std::string_view rule) {
  throw Error(std::string(where), detail::describe(name, value), std::string(rule));
}

}  // namespace attnkit

// ATTNKIT_REQUIRE(cond, where, name, value, rule): throw unless cond holds. `rule` may be any
// expression convertible to std::string (built lazily, only on failure).
#define ATTNKIT_REQUIRE(cond, where, name, value, rule)        \
  do {                                                         \
    if (!(cond)) ::attnkit::fail((where), (name), (value), (rule)); \
  } while (0)
