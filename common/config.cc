#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>

#include "common/check.h"
#include "common/status.h"
#include "common/strings.h"

namespace strata {

struct ConfigSchema::Option {
  std::string key;
  std::string help;
  std::string type_name;  // shown in errors: "bool", "int", "bytes", ...
  bool is_list = false;
  // Parses a scalar (or, for lists, a comma-separated string) into the field.
  std::function<absl::Status(std::string_view)> parse;
  // Parses a YAML sequence into the field (lists only).
  std::function<absl::Status(const std::vector<std::string>&)> parse_list;
  // The field's value as YAML.
  std::function<std::string()> render;
  ConfigSource source = ConfigSource::kDefault;
};

namespace {

bool ValidKey(std::string_view key) {
  if (key.empty() || key.front() == '.' || key.back() == '.') return false;
  char prev = 0;
  for (char c : key) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok || (c == '.' && prev == '.')) return false;
    prev = c;
  }
  return true;
}

std::string YamlScalar(std::string_view s) {
  YAML::Emitter out;
  out << std::string(s);
  return out.c_str();
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

absl::Status BadValue(std::string_view what, std::string_view text) {
  return absl::InvalidArgumentError(StrCat("expected ", what, ", got '", text, "'"));
}

}  // namespace

std::string_view ConfigSourceName(ConfigSource source) {
  switch (source) {
    case ConfigSource::kDefault:
      return "default";
    case ConfigSource::kFile:
      return "file";
    case ConfigSource::kEnv:
      return "env";
    case ConfigSource::kFlag:
      return "flag";
  }
  return "?";
}

absl::StatusOr<uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = StripWhitespace(text);
  size_t split = 0;
  while (split < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[split])) || s[split] == '.')) {
    ++split;
  }
  const std::optional<double> parsed = ParseDouble(s.substr(0, split));
  if (split == 0 || !parsed) {
    return BadValue("a size such as 4096, 64MiB or 2GiB", text);
  }
  const double number = *parsed;
  const std::string unit = AsciiToLower(StripWhitespace(s.substr(split)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},          {"b", 1},       {"k", 1024.0},    {"kib", 1024.0},   {"m", 1 << 20},
      {"mib", 1 << 20}, {"g", 1 << 30}, {"gib", 1 << 30}, {"t", 1ull << 40}, {"tib", 1ull << 40},
      {"kb", 1e3},      {"mb", 1e6},    {"gb", 1e9},      {"tb", 1e12}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) return BadValue("a size such as 4096, 64MiB or 2GiB", text);
  const double bytes = number * it->second;
  if (bytes > 1.8e19 || bytes != std::floor(bytes)) {
    return BadValue("a whole number of bytes within 64 bits", text);
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  if (bytes == 0) return "0";
  for (auto [size, name] : kUnits) {
    if (bytes % size == 0) return StrCat(bytes / size, name);
  }
  return StrCat(bytes);
}

ConfigSchema::ConfigSchema() = default;
ConfigSchema::~ConfigSchema() = default;

std::string ConfigSchema::EnvName(std::string_view key) {
  std::string name = "STRATA_";
  for (char c : key)
    name.push_back(c == '.' || c == '-'
                       ? '_'
                       : static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  return name;
}

void ConfigSchema::Add(std::unique_ptr<Option> option) {
  STRATA_CHECK(ValidKey(option->key), option->key.c_str());
  for (const auto& other : options_) {
    STRATA_CHECK(other->key != option->key, option->key.c_str());
    STRATA_CHECK(
        !other->key.starts_with(option->key + ".") && !option->key.starts_with(other->key + "."),
        "a config key is a section of another");
  }
  options_.push_back(std::move(option));
}

ConfigSchema::Option* ConfigSchema::Find(std::string_view key) const {
  for (const auto& option : options_) {
    if (option->key == key) return option.get();
  }
  return nullptr;
}

std::string ConfigSchema::Suggest(std::string_view key) const {
  const Option* best = nullptr;
  size_t best_distance = 4;  // suggest only near misses
  for (const auto& option : options_) {
    const size_t d = EditDistance(key, option->key);
    if (d < best_distance) {
      best_distance = d;
      best = option.get();
    }
  }
  return best == nullptr ? "" : StrCat(" (did you mean '", best->key, "'?)");
}

void ConfigSchema::AddBool(std::string_view key, bool* field, std::string_view help) {
  auto o = std::make_unique<Option>();
  o->key = key;
  o->help = help;
  o->type_name = "bool";
  o->parse = [field](std::string_view text) {
    const std::string t = AsciiToLower(text);
    if (t == "true" || t == "yes" || t == "on" || t == "1") {
      *field = true;
    } else if (t == "false" || t == "no" || t == "off" || t == "0") {
      *field = false;
    } else {
      return BadValue("true or false", text);
    }
    return absl::OkStatus();
  };
  o->render = [field] { return std::string(*field ? "true" : "false"); };
  Add(std::move(o));
}

void ConfigSchema::AddInt(std::string_view key, int64_t* field, std::string_view help, int64_t min,
                          int64_t max) {
  auto o = std::make_unique<Option>();
  o->key = key;
  o->help = help;
  o->type_name = "int";
  o->parse = [field, min, max](std::string_view text) {
    const std::optional<int64_t> parsed = ParseInt64(StripWhitespace(text));
    if (!parsed) return BadValue("an integer", text);
    const int64_t v = *parsed;
    if (v < min || v > max) {
      return absl::InvalidArgumentError(StrCat("value ", v, " is outside [", min, ", ", max, "]"));
    }
    *field = v;
    return absl::OkStatus();
  };
  o->render = [field] { return StrCat(*field); };
  Add(std::move(o));
}

void ConfigSchema::AddDouble(std::string_view key, double* field, std::string_view help) {
  auto o = std::make_unique<Option>();
  o->key = key;
  o->help = help;
  o->type_name = "number";
  o->parse = [field](std::string_view text) {
    const std::optional<double> v = ParseDouble(StripWhitespace(text));
    if (!v || !std::isfinite(*v)) return BadValue("a number", text);
    *field = *v;
    return absl::OkStatus();
  };
  o->render = [field] { return StrCat(*field); };
  Add(std::move(o));
}

void ConfigSchema::AddString(std::string_view key, std::string* field, std::string_view help) {
  auto o = std::make_unique<Option>();
  o->key = key;
  o->help = help;
  o->type_name = "string";
  o->parse = [field](std::string_view text) {
    field->assign(text);
    return absl::OkStatus();
  };
  o->render = [field] { return YamlScalar(*field); };
  Add(std::move(o));
}

void ConfigSchema::AddEnum(std::string_view key, std::string* field,
                           std::vector<std::string> choices, std::string_view help) {
  auto o = std::make_unique<Option>();
  o->key = key;
  o->help = StrCat(help, " [", StrJoin(choices, "|"), "]");
  o->type_name = "enum";
  o->parse = [field, choices = std::move(choices)](std::string_view text) {
    if (std::find(choices.begin(), choices.end(), text) == choices.end()) {
      return BadValue(StrCat("one of ", StrJoin(choices, ", ")), text);
    }
    field->assign(text);
    return absl::OkStatus();
  };
  o->render = [field] { return YamlScalar(*field); };
  Add(std::move(o));
}

void ConfigSchema::AddBytes(std::string_view key, uint64_t* field, std::string_view help) {
  auto o = std::make_unique<Option>();
  o->key = key;
  o->help = help;
  o->type_name = "bytes";
  o->parse = [field](std::string_view text) {
    ASSIGN_OR_RETURN(*field, ParseBytes(text));
    return absl::OkStatus();
  };
  o->render = [field] { return FormatBytes(*field); };
  Add(std::move(o));
}

void ConfigSchema::AddDuration(std::string_view key, absl::Duration* field, std::string_view help) {
  auto o = std::make_unique<Option>();
  o->key = key;
  o->help = help;
  o->type_name = "duration";
  o->parse = [field](std::string_view text) {
    absl::Duration d;
    if (!absl::ParseDuration(ToAbsl(StripWhitespace(text)), &d) || d < absl::ZeroDuration()) {
      return BadValue("a duration such as 250ms, 30s or 1h30m", text);
    }
    *field = d;
    return absl::OkStatus();
  };
  o->render = [field] { return absl::FormatDuration(*field); };
  Add(std::move(o));
}

void ConfigSchema::AddStringList(std::string_view key, std::vector<std::string>* field,
                                 std::string_view help) {
  auto o = std::make_unique<Option>();
  o->key = key;
  o->help = help;
  o->type_name = "list";
  o->is_list = true;
  o->parse = [field](std::string_view text) {
    field->clear();
    for (std::string_view item : StrSplit(text, ',', /*skip_empty=*/true)) {
      field->emplace_back(StripWhitespace(item));
    }
    return absl::OkStatus();
  };
  o->parse_list = [field](const std::vector<std::string>& items) {
    *field = items;
    return absl::OkStatus();
  };
  o->render = [field] {
    if (field->empty()) return std::string("[]");
    std::vector<std::string> quoted;
    for (const auto& s : *field) quoted.push_back(YamlScalar(s));
    return StrCat("[", StrJoin(quoted, ", "), "]");
  };
  Add(std::move(o));
}

absl::Status ConfigSchema::LoadFile(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(StrCat("cannot read config file ", path));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        StrCat(path, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  if (root.IsNull()) return absl::OkStatus();  // an empty file
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(StrCat(path, ": the top level must be a mapping"));
  }

  // Walk the tree; every leaf must be a declared key.
  std::function<absl::Status(const YAML::Node&, const std::string&)> walk =
      [&](const YAML::Node& node, const std::string& prefix) -> absl::Status {
    for (const auto& entry : node) {
      const std::string name = entry.first.as<std::string>();
      const std::string key = prefix.empty() ? name : StrCat(prefix, ".", name);
      const YAML::Node& value = entry.second;
      const std::string where = StrCat(path, ":", value.Mark().line + 1, ": ");
      Option* option = Find(key);
      if (option == nullptr) {
        const bool is_section = std::any_of(options_.begin(), options_.end(), [&](const auto& o) {
          return o->key.starts_with(key + ".");
        });
        if (!is_section) {
          return absl::InvalidArgumentError(
              StrCat(where, "unknown config key '", key, "'", Suggest(key)));
        }
        if (!value.IsMap()) {
          return absl::InvalidArgumentError(
              StrCat(where, "'", key, "' is a section and needs a mapping"));
        }
        RETURN_IF_ERROR(walk(value, key));
        continue;
      }
      absl::Status st;
      if (value.IsScalar()) {
        st = option->parse(value.Scalar());
      } else if (value.IsSequence() && option->is_list) {
        std::vector<std::string> items;
        for (const auto& item : value) {
          if (!item.IsScalar()) {
            return absl::InvalidArgumentError(
                StrCat(where, "'", key, "' must be a list of scalars"));
          }
          items.push_back(item.Scalar());
        }
        st = option->parse_list(items);
      } else {
        st = absl::InvalidArgumentError(StrCat("needs a ", option->type_name, " value"));
      }
      RETURN_IF_ERROR_WITH(st, where, key);
      option->source = ConfigSource::kFile;
    }
    return absl::OkStatus();
  };
  return walk(root, "");
}

absl::Status ConfigSchema::Load(const ConfigSources& sources) {
  if (!sources.file.empty()) RETURN_IF_ERROR(LoadFile(sources.file));

  for (const auto& option : options_) {
    const std::string env = EnvName(option->key);
    const char* value = sources.getenv ? sources.getenv(env.c_str()) : std::getenv(env.c_str());
    if (value == nullptr) continue;
    RETURN_IF_ERROR_WITH(option->parse(value), "environment variable ", env);
    option->source = ConfigSource::kEnv;
  }

  for (const std::string& assignment : sources.overrides) {
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(StrCat("--set expects key=value, got '", assignment, "'"));
    }
    const std::string key = assignment.substr(0, eq);
    Option* option = Find(key);
    if (option == nullptr) {
      return absl::InvalidArgumentError(
          StrCat("--set: unknown config key '", key, "'", Suggest(key)));
    }
    RETURN_IF_ERROR_WITH(option->parse(std::string_view(assignment).substr(eq + 1)), "--set ", key);
    option->source = ConfigSource::kFlag;
  }
  return absl::OkStatus();
}

absl::StatusOr<ConfigSource> ConfigSchema::SourceOf(std::string_view key) const {
  const Option* option = Find(key);
  if (option == nullptr) return absl::NotFoundError(StrCat("unknown config key ", key));
  return option->source;
}

std::string ConfigSchema::Render(bool annotate) const {
  // Print keys grouped by section, sections in order of first appearance.
  struct Node {
    std::string name;
    const Option* option = nullptr;
    std::vector<std::unique_ptr<Node>> children;
  };
  Node root;
  for (const auto& option : options_) {
    Node* node = &root;
    for (std::string_view part : StrSplit(option->key, '.')) {
      auto it = std::find_if(node->children.begin(), node->children.end(),
                             [&](const auto& c) { return c->name == part; });
      if (it == node->children.end()) {
        node->children.push_back(std::make_unique<Node>());
        node->children.back()->name = std::string(part);
        it = std::prev(node->children.end());
      }
      node = it->get();
    }
    node->option = option.get();
  }
  std::string out;
  std::function<void(const Node&, int)> emit = [&](const Node& node, int depth) {
    for (const auto& child : node.children) {
      const std::string indent(2 * depth, ' ');
      if (child->option == nullptr) {
        StrAppend(&out, indent, child->name, ":\n");
        emit(*child, depth + 1);
        continue;
      }
      StrAppend(&out, indent, child->name, ": ", child->option->render());
      if (annotate) {
        StrAppend(&out, "  # ", child->option->help, " (", ConfigSourceName(child->option->source),
                  ")");
      }
      out.push_back('\n');
    }
  };
  emit(root, 0);
  return out;
}

}  // namespace strata
