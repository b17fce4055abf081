// strata chat [--url URL | --config FILE] [--system TEXT] [--say TEXT]... [--json-out FILE]
//
// A multi-turn chat against the OpenAI API of a Strata cluster, for people: each answer streams
// as it is generated, followed by its time to first token and how much of the prompt the cluster
// found cached (by tier). Every turn sends the whole conversation, so from turn 2 on the prompt
// starts with what the cluster has already seen. With --say the turns are given on the command
// line; without, they are read from stdin, one line each.
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>

#include "absl/time/clock.h"
#include "cli/commands.h"
#include "cli/strata_config.h"
#include "common/file_util.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"
#include "scheduler/client/openai_client.h"

namespace strata::cli {
namespace {

using nlohmann::json;

struct ChatArgs {
  std::string url;
  ConfigFlags config;
  std::string model;
  std::string system;
  std::string system_file;
  std::vector<std::string> say;
  int64_t max_tokens = 48;
  double temperature = 0;
  std::string cache_salt;
  std::string api_key;
  std::string json_out;
};

struct TurnResult {
  std::string text;
  double ttft_ms = 0;
  double total_ms = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  json by_tier;
};

std::string GatewayUrl(const ChatArgs& args) {
  if (!args.url.empty()) return args.url;
  if (!args.config.file.empty()) {
    StrataConfig config;
    ConfigSchema schema;
    config.Register(schema);
    if (absl::Status st = schema.Load({.file = args.config.file}); !st.ok()) {
      Fail(2, StrCat("config: ", st.message()));
    }
    return StrCat("http://", config.scheduler.http_listen);
  }
  return "http://127.0.0.1:8000";
}

std::string FirstModel(scheduler::OpenAiClient& client) {
  auto reply = client.Get("/v1/models");
  if (!reply.ok()) Fail(5, StrCat("the API does not answer: ", reply.status().message()));
  if (absl::Status st = scheduler::StatusFromHttp(*reply); !st.ok()) {
    Fail(1, StrCat("/v1/models: ", st.message()));
  }
  const json models = json::parse(reply->body, nullptr, false);
  if (!models.contains("data") || models["data"].empty()) Fail(1, "the API lists no model");
  return models["data"][0].value("id", "");
}

TurnResult RunTurn(scheduler::OpenAiClient& client, const json& body, bool tty) {
  TurnResult turn;
  const absl::Time start = absl::Now();
  std::string stream_error;
  auto reply = client.PostStream("/v1/chat/completions", body, [&](const json& event) {
    if (event.contains("error") && event["error"].is_object()) {
      stream_error = event["error"].value("message", "unknown error");
      return false;
    }
    if (event.contains("choices") && !event["choices"].empty()) {
      const json& delta = event["choices"][0].value("delta", json::object());
      if (delta.contains("content") && delta["content"].is_string()) {
        const std::string piece = delta["content"].get<std::string>();
        if (turn.text.empty() && !piece.empty()) {
          turn.ttft_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
        }
        turn.text += piece;
        std::cout << piece << std::flush;
      }
    }
    if (event.contains("usage") && event["usage"].is_object()) {
      const json& u = event["usage"];
      turn.prompt_tokens = u.value("prompt_tokens", 0);
      turn.completion_tokens = u.value("completion_tokens", 0);
      turn.cached_tokens =
          u.value("prompt_tokens_details", json::object()).value("cached_tokens", 0);
      turn.by_tier =
          u.value("strata", json::object()).value("cached_tokens_by_tier", json::object());
    }
    return true;
  });
  turn.total_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!reply.ok()) Fail(5, StrCat("\nthe request failed: ", reply.status().message()));
  if (absl::Status st = scheduler::StatusFromHttp(*reply); !st.ok()) {
    Fail(1, StrCat("\nthe request failed (HTTP ", reply->status, "): ", st.message()));
  }
  if (!stream_error.empty()) Fail(1, StrCat("\nthe answer broke off: ", stream_error));
  std::cout << "\n";
  const double pct = turn.prompt_tokens > 0 ? 100.0 * turn.cached_tokens / turn.prompt_tokens : 0;
  std::string tiers;
  for (const char* tier : {"gpu", "dram", "ssd"}) {
    const int64_t n = turn.by_tier.value(tier, 0);
    if (n > 0) StrAppend(&tiers, tiers.empty() ? "" : ", ", tier, " ", n);
  }
  const double decode_s = (turn.total_ms - turn.ttft_ms) / 1000;
  std::cout << (tty ? "\033[2m" : "")
            << fmt::format(
                   "  [TTFT {:.0f} ms · {} tokens at {:.1f} tok/s · prompt {} tokens, "
                   "{} cached ({:.0f}%{}{})]",
                   turn.ttft_ms, turn.completion_tokens,
                   decode_s > 0 ? (turn.completion_tokens - 1) / decode_s : 0.0, turn.prompt_tokens,
                   turn.cached_tokens, pct, tiers.empty() ? "" : ": ", tiers)
            << (tty ? "\033[0m" : "") << "\n"
            << std::endl;
  return turn;
}

int RunChat(const ChatArgs& args) {
  absl::StatusOr<scheduler::OpenAiEndpoint> endpoint = scheduler::ParseOpenAiUrl(GatewayUrl(args));
  if (!endpoint.ok()) Fail(2, std::string(endpoint.status().message()));
  endpoint->api_key = args.api_key;
  scheduler::OpenAiClient client(*endpoint);
  const std::string model = args.model.empty() ? FirstModel(client) : args.model;

  json messages = json::array();
  std::string system = args.system;
  if (!args.system_file.empty()) {
    auto text = ReadFile(args.system_file);
    if (!text.ok()) Fail(2, std::string(text.status().message()));
    system = *text;
  }
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});

  const bool tty = ::isatty(STDOUT_FILENO);
  const bool interactive = args.say.empty();
  json log = json::array();
  for (size_t i = 0;; ++i) {
    std::string said;
    if (!interactive) {
      if (i == args.say.size()) break;
      said = args.say[i];
    } else {
      if (::isatty(STDIN_FILENO)) std::cout << "you> " << std::flush;
      if (!std::getline(std::cin, said)) break;
      if (said.empty()) continue;
    }
    if (!interactive) std::cout << "you> " << said << "\n";
    std::cout << "strata> " << std::flush;
    messages.push_back({{"role", "user"}, {"content", said}});
    json body = {{"model", model},
                 {"messages", messages},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}},
                 {"max_tokens", args.max_tokens},
                 {"temperature", args.temperature}};
    if (!args.cache_salt.empty()) body["cache_salt"] = args.cache_salt;
    TurnResult turn = RunTurn(client, body, tty);
    messages.push_back({{"role", "assistant"}, {"content", turn.text}});
    log.push_back({{"turn", i + 1},
                   {"text", turn.text},
                   {"ttft_ms", turn.ttft_ms},
                   {"prompt_tokens", turn.prompt_tokens},
                   {"completion_tokens", turn.completion_tokens},
                   {"cached_tokens", turn.cached_tokens},
                   {"cached_tokens_by_tier", turn.by_tier}});
  }
  if (!args.json_out.empty()) {
    std::ofstream out(args.json_out, std::ios::trunc);
    out << log.dump(2) << "\n";
    if (!out.flush()) Fail(1, StrCat("cannot write ", args.json_out));
  }
  return 0;
}

}  // namespace

void RegisterChatCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "chat", "A multi-turn chat on a cluster's OpenAI API, with TTFT and cached tokens per turn");
  auto args = std::make_shared<ChatArgs>();
  cmd->add_option("--url", args->url, "The API's base URL (default http://127.0.0.1:8000)");
  cmd->add_option(
         "--config,-c", args->config.file,
         "Take the URL from this config's scheduler.http_listen (e.g. strata-run/cluster.yaml)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--model", args->model, "Model id (default: the first the API lists)");
  cmd->add_option("--system", args->system, "System prompt");
  cmd->add_option("--system-file", args->system_file, "System prompt from a file")
      ->check(CLI::ExistingFile);
  cmd->add_option("--say", args->say,
                  "A user turn (repeatable); without it, turns come from stdin");
  cmd->add_option("--max-tokens", args->max_tokens, "Longest answer")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", args->temperature, "Sampling temperature (0: greedy)");
  cmd->add_option("--cache-salt", args->cache_salt, "Tenant salt: isolates this chat's cache");
  cmd->add_option("--api-key", args->api_key, "Bearer API key");
  cmd->add_option("--json-out", args->json_out, "Write each turn's text and figures here (JSON)");
  cmd->callback([args] { std::exit(RunChat(*args)); });
}

}  // namespace strata::cli
