#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <random>

#include "common/hex.h"
#include "common/strings.h"

namespace strata {
namespace {

thread_local std::string current_request_id;

// Appends `s` to `dest` as the inside of a JSON string.
void AppendJsonEscaped(std::string_view s, spdlog::memory_buf_t& dest) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        dest.append(std::string_view("\\\""));
        break;
      case '\\':
        dest.append(std::string_view("\\\\"));
        break;
      case '\n':
        dest.append(std::string_view("\\n"));
        break;
      case '\r':
        dest.append(std::string_view("\\r"));
        break;
      case '\t':
        dest.append(std::string_view("\\t"));
        break;
      default:
        if (c < 0x20) {
          const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xf]};
          dest.append(esc, esc + sizeof(esc));
        } else {
          dest.push_back(static_cast<char>(c));
        }
    }
  }
}

// %* : the request id, "-" when none (text) — JSON uses %~ below.
class RequestIdFlag : public spdlog::custom_flag_formatter {
 public:
  explicit RequestIdFlag(bool json) : json_(json) {}
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string_view rid = current_request_id;
    if (json_) {
      AppendJsonEscaped(rid, dest);
    } else {
      dest.append(rid.empty() ? std::string_view("-") : rid);
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RequestIdFlag>(json_);
  }

 private:
  bool json_;
};

// %~ : the message, escaped for a JSON string.
class JsonMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    AppendJsonEscaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

}  // namespace

absl::Status ParseLogFormat(std::string_view name, LogFormat* out) {
  if (name == "text") {
    *out = LogFormat::kText;
  } else if (name == "json") {
    *out = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        StrCat("unknown log format '", name, "' (expected text or json)"));
  }
  return absl::OkStatus();
}

absl::Status InitLogging(const LogOptions& options) {
  const spdlog::level::level_enum level = spdlog::level::from_str(options.level);
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (level == spdlog::level::off && options.level != "off") {
    return absl::InvalidArgumentError(
        StrCat("unknown log level '", options.level,
               "' (expected trace, debug, info, warn, error, critical or off)"));
  }

  spdlog::sink_ptr sink;
  if (options.file.empty()) {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  } else {
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file);
    } catch (const spdlog::spdlog_ex& e) {
      return absl::UnavailableError(StrCat("cannot open log file ", options.file, ": ", e.what()));
    }
  }

  const bool json = options.format == LogFormat::kJson;
  std::string component;
  if (json) {
    spdlog::memory_buf_t escaped;
    AppendJsonEscaped(options.component, escaped);
    component.assign(escaped.data(), escaped.size());
  } else {
    component = options.component.empty() ? "strata" : options.component;
  }
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc,
                                                               std::string("\n"));
  formatter->add_flag<RequestIdFlag>('*', json).add_flag<JsonMessageFlag>('~');
  if (json) {
    formatter->set_pattern(StrCat(R"({"ts":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l",)",
                                  R"("component":")", component, R"(","rid":"%*","msg":"%~"})"));
  } else {
    formatter->set_pattern(StrCat("%Y-%m-%dT%H:%M:%S.%fZ %L ", component, " [%*] %v"));
  }
  sink->set_formatter(std::move(formatter));

  auto logger = std::make_shared<spdlog::logger>("strata", sink);
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

ScopedRequestId::ScopedRequestId(std::string_view id) : previous_(current_request_id) {
  current_request_id.assign(id);
}

ScopedRequestId::~ScopedRequestId() { current_request_id = std::move(previous_); }

std::string_view CurrentRequestId() { return current_request_id; }

std::string NewRequestId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  const uint64_t v = rng();
  uint8_t bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(v >> (8 * i));
  return HexEncode(bytes);
}

}  // namespace strata
