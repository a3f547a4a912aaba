#include "common/json/bounded_json.h"

#include <cstddef>
#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace bus {
namespace {

using Json = nlohmann::json;

// nlohmann's DOM builder behind a SAX handler that stops the parse at the first array or object
// deeper than the bound, before anything of it is built.
class DepthBoundedSax {
 public:
  DepthBoundedSax(Json& out, int max_depth)
      : dom_(out, /*allow_exceptions=*/false), max_(max_depth) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& s) {
    return dom_.number_float(v, s);
  }
  bool string(Json::string_t& v) { return dom_.string(v); }
  bool binary(Json::binary_t& v) { return dom_.binary(v); }
  bool key(Json::string_t& v) { return dom_.key(v); }
  bool start_object(std::size_t n) { return Deeper() && dom_.start_object(n); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Deeper() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = e.what();
    return false;
  }

  bool too_deep() const { return too_deep_; }
  const std::string& error() const { return error_; }

 private:
  bool Deeper() {
    if (++depth_ <= max_) return true;
    too_deep_ = true;
    return false;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  const int max_;
  int depth_ = 0;
  bool too_deep_ = false;
  std::string error_;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonBounded(absl::string_view text, int max_depth) {
  Json out;
  DepthBoundedSax sax(out, max_depth < 1 ? 1 : max_depth);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not JSON: ", e.what()));
  }
  if (sax.too_deep()) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON nested deeper than ", max_depth < 1 ? 1 : max_depth, " levels"));
  }
  if (!ok) return absl::InvalidArgumentError(absl::StrCat("not JSON: ", sax.error()));
  return out;
}

}  // namespace bus
