// A minimal JSON writer for ffpa-bench's one-object-per-line output: nested
// objects and arrays, strings, numbers (non-finite ones as null), booleans.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace ffpa::bench {

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }

  // The name of the next member of the current object.
  JsonWriter& key(std::string_view name) {
    separate();
    append_string(name);
    out_ += ':';
    after_key_ = true;
    return *this;
  }

  JsonWriter& string(std::string_view text) {
    separate();
    append_string(text);
    return *this;
  }
  JsonWriter& number(double value) {
    if (!std::isfinite(value)) return null();
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", value);
    return raw(text);
  }
  JsonWriter& integer(int64_t value) { return raw(std::to_string(value)); }
  JsonWriter& unsigned_integer(uint64_t value) { return raw(std::to_string(value)); }
  JsonWriter& boolean(bool value) { return raw(value ? "true" : "false"); }
  JsonWriter& null() { return raw("null"); }

  const std::string& text() const { return out_; }

 private:
  JsonWriter& open(char bracket) {
    separate();
    out_ += bracket;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char bracket) {
    out_ += bracket;
    first_.pop_back();
    return *this;
  }
  JsonWriter& raw(std::string_view text) {
    separate();
    out_ += text;
    return *this;
  }
  // A comma before every element but the first of its container; none after a key.
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
  void append_string(std::string_view text) {
    out_ += '"';
    for (const char c : text) {
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
        out_ += escaped;
      } else {
        out_ += c;
      }
    }
    out_ += '"';
  }

  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace ffpa::bench
