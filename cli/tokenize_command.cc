// strata tokenize: the DeepSeek-V3 tokenizer from the command line, for people and tests.
//
//   strata tokenize --text "Hello"                 ids, space-separated
//   strata tokenize --file prompt.txt --json       {"ids": [...], "count": N}
//   strata tokenize --chat-json chat.json --add-generation-prompt --json
//                                                  chat template, then ids (+ "text")
//   strata tokenize --decode "19923 2058"          text
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "common/file_util.h"
#include "common/paths.h"
#include "common/strings.h"
#include "compute_nodes/tokenizer/chat_template.h"
#include "compute_nodes/tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

struct TokenizeFlags {
  std::string tokenizer_dir;
  std::string text;
  std::string file;
  std::string chat_json;
  std::string decode;
  bool add_special_tokens = false;
  bool add_generation_prompt = false;
  bool skip_special_tokens = false;
  bool json = false;
};

std::string ReadFileOrFail(const std::string& path) {
  auto contents = ReadFile(path);
  if (!contents.ok()) Fail(2, StrCat("tokenize: ", contents.status().message()));
  return *std::move(contents);
}

void Run(const TokenizeFlags& f) {
  const int inputs = !f.text.empty() + !f.file.empty() + !f.chat_json.empty() + !f.decode.empty();
  if (inputs != 1) Fail(2, "tokenize: give exactly one of --text, --file, --chat-json, --decode");
  auto tokenizer = tokenizer::Tokenizer::Load(f.tokenizer_dir);
  if (!tokenizer.ok()) Fail(2, StrCat("tokenize: ", tokenizer.status().ToString()));
  const tokenizer::Tokenizer& tok = **tokenizer;

  if (!f.decode.empty()) {
    const std::string text =
        tok.Decode(ParseTokenIdsOrFail(f.decode, "tokenize"), f.skip_special_tokens);
    if (f.json) {
      std::cout << nlohmann::json{{"text", text}}.dump() << "\n";
    } else {
      std::cout << text << "\n";
    }
    return;
  }

  std::string text;
  bool add_special_tokens = f.add_special_tokens;
  if (!f.chat_json.empty()) {
    // A JSON array of messages, or {"messages": [...], "add_generation_prompt": bool}.
    const std::string body = ReadFileOrFail(f.chat_json);
    const nlohmann::json doc = nlohmann::json::parse(body, nullptr, false);
    if (doc.is_discarded()) Fail(2, StrCat("tokenize: ", f.chat_json, " is not valid JSON"));
    bool add_generation_prompt = f.add_generation_prompt;
    std::string messages_json = body;
    if (doc.is_object()) {
      messages_json = doc.value("messages", nlohmann::json()).dump();
      add_generation_prompt = doc.value("add_generation_prompt", add_generation_prompt);
    }
    auto messages = tokenizer::ParseChatMessages(messages_json);
    if (!messages.ok()) Fail(2, StrCat("tokenize: ", messages.status().ToString()));
    if (absl::Status st = tokenizer::CheckDeepSeekV3ChatTemplate(tok.chat_template()); !st.ok()) {
      Fail(2, StrCat("tokenize: ", st.ToString()));
    }
    auto rendered = tokenizer::RenderChat(*messages, add_generation_prompt, tok.bos_token());
    if (!rendered.ok()) Fail(2, StrCat("tokenize: ", rendered.status().ToString()));
    text = *std::move(rendered);
    add_special_tokens = false;  // the template holds the BOS already
  } else {
    text = !f.file.empty() ? ReadFileOrFail(f.file) : f.text;
  }
  auto ids = tok.Encode(text, add_special_tokens);
  if (!ids.ok()) Fail(2, StrCat("tokenize: ", ids.status().ToString()));
  if (f.json) {
    nlohmann::json out{{"ids", *ids}, {"count", ids->size()}};
    if (!f.chat_json.empty()) out["text"] = text;
    std::cout << out.dump() << "\n";
  } else {
    std::cout << StrJoin(*ids, " ") << "\n";
  }
}

}  // namespace

void RegisterTokenizeCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text or a chat, or decode token ids");
  auto f = std::make_shared<TokenizeFlags>();
  f->tokenizer_dir = DeepSeekV3TokenizerDir();
  cmd->add_option("--tokenizer", f->tokenizer_dir,
                  "Directory with tokenizer.json and tokenizer_config.json")
      ->capture_default_str();
  cmd->add_option("--text", f->text, "Text to encode");
  cmd->add_option("--file", f->file, "File whose contents to encode")->check(CLI::ExistingFile);
  cmd->add_option("--chat-json", f->chat_json,
                  "JSON chat ([{role, content}...] or {messages, add_generation_prompt}) to "
                  "render with the chat template and encode")
      ->check(CLI::ExistingFile);
  cmd->add_option("--decode", f->decode, "Token ids to decode (\"1 2 3\", \"1,2,3\" or \"[1,2]\")");
  cmd->add_flag("--add-special-tokens", f->add_special_tokens,
                "Add BOS/EOS as tokenizer_config.json says (text and file only)");
  cmd->add_flag("--add-generation-prompt", f->add_generation_prompt,
                "End a chat with the assistant prefix");
  cmd->add_flag("--skip-special-tokens", f->skip_special_tokens, "Decode without special tokens");
  cmd->add_flag("--json", f->json, "Print JSON");
  cmd->callback([f] { Run(*f); });
}

}  // namespace strata::cli
