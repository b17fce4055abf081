#include "scheduler/batch/batch_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/status.h"
#include "common/strings.h"

namespace strata::scheduler::batch {

using nlohmann::json;

absl::StatusOr<ResumeState> LoadOutput(const std::string& path) {
  ResumeState state;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return state;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(StrCat("cannot read the output ", path));
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  in.close();
  size_t pos = 0;
  size_t line = 0;
  size_t keep = 0;  // bytes of complete, valid lines
  while (pos < text.size()) {
    ++line;
    const size_t nl = text.find('\n', pos);
    const bool complete = nl != std::string::npos;
    const std::string_view raw(text.data() + pos, (complete ? nl : text.size()) - pos);
    const size_t next = complete ? nl + 1 : text.size();
    const bool last = next >= text.size();
    if (StripWhitespace(raw).empty()) {
      if (complete) keep = next;
      pos = next;
      continue;
    }
    json j = json::parse(raw.begin(), raw.end(), nullptr, /*allow_exceptions=*/false);
    const bool valid =
        !j.is_discarded() && j.is_object() && j.contains("custom_id") && j["custom_id"].is_string();
    if (!valid || !complete) {
      if (!last) {
        return absl::DataLossError(StrCat(path, ":", line,
                                          ": not a batch output line; fix or remove it before "
                                          "resuming"));
      }
      state.truncated_last_line = true;  // a crash mid-write: this request runs again
      break;
    }
    state.done.insert(j["custom_id"].get<std::string>());
    ++state.lines;
    keep = next;
    pos = next;
  }
  if (keep < text.size()) {
    if (::truncate(path.c_str(), static_cast<off_t>(keep)) != 0) {
      return ErrnoToStatus(errno, StrCat("cutting the torn last line off ", path));
    }
  }
  return state;
}

JsonlAppender::~JsonlAppender() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status JsonlAppender::Open(const std::string& path, bool truncate) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0),
               0644);
  if (fd_ < 0) return ErrnoToStatus(errno, StrCat("opening ", path, " for writing"));
  return absl::OkStatus();
}

absl::Status JsonlAppender::Append(const json& line) {
  std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace);
  text.push_back('\n');
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, StrCat("writing ", path_));
    }
    off += static_cast<size_t>(n);
  }
  ++lines_written_;
  return absl::OkStatus();
}

json SuccessLine(const std::string& id, const std::string& custom_id, const json& body) {
  std::string request_id;
  if (body.is_object() && body.contains("id") && body["id"].is_string()) {
    request_id = body["id"].get<std::string>();
  }
  return json{{"id", id},
              {"custom_id", custom_id},
              {"response", {{"status_code", 200}, {"request_id", request_id}, {"body", body}}},
              {"error", nullptr}};
}

json ErrorLine(const std::string& id, const std::string& custom_id, int status_code,
               const std::string& reply_body, const std::string& code, const std::string& message) {
  json response = nullptr;
  if (status_code != 0) {
    json body = json::parse(reply_body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) body = reply_body;
    response = {{"status_code", status_code}, {"request_id", ""}, {"body", body}};
  }
  return json{{"id", id},
              {"custom_id", custom_id},
              {"response", response},
              {"error", {{"code", code}, {"message", message}}}};
}

}  // namespace strata::scheduler::batch
