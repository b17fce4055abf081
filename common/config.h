// One configuration mechanism for every Strata process.
//
// A process describes its settings once, as typed options bound to the fields of plain structs,
// then loads them from three sources in a fixed order of precedence:
//
//   defaults  <  YAML file  <  STRATA_* environment variables  <  --set key=value flags
//
// Keys are dotted paths ("log.level" is `log: {level: ...}` in YAML). The environment variable
// of a key is STRATA_ followed by the key in upper case with '.' and '-' turned into '_'
// ("log.level" → STRATA_LOG_LEVEL). A key in the file or in a flag that no option declares is an
// error that names it (and suggests the nearest known key); so is a value of the wrong type.
//
//   struct LogConfig { std::string level = "info"; };
//   LogConfig log;
//   ConfigSchema schema;
//   schema.AddString("log.level", &log.level, "Minimum level logged");
//   RETURN_IF_ERROR(schema.Load({.file = path, .overrides = flags}));
//
// Not thread-safe: load once at start-up, before other threads read the fields.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata {

struct ConfigSources {
  std::string file;                    // YAML file; empty for none
  std::vector<std::string> overrides;  // "key=value", applied last, in order
  // Environment lookup; tests inject their own. Null means the process environment.
  std::function<const char*(const char*)> getenv;
};

enum class ConfigSource { kDefault, kFile, kEnv, kFlag };
std::string_view ConfigSourceName(ConfigSource source);

class ConfigSchema {
 public:
  ConfigSchema();
  ~ConfigSchema();
  ConfigSchema(const ConfigSchema&) = delete;
  ConfigSchema& operator=(const ConfigSchema&) = delete;

  // Each Add* binds `key` to `field`; the field's current value is the default. Keys must be
  // unique and valid (lower-case letters, digits, '_' and '-', segments separated by '.'),
  // and no key may be a prefix segment of another; violations are programming errors (abort).
  void AddBool(std::string_view key, bool* field, std::string_view help);
  void AddInt(std::string_view key, int64_t* field, std::string_view help,
              int64_t min = std::numeric_limits<int64_t>::min(),
              int64_t max = std::numeric_limits<int64_t>::max());
  void AddDouble(std::string_view key, double* field, std::string_view help);
  void AddString(std::string_view key, std::string* field, std::string_view help);
  // One of `choices`.
  void AddEnum(std::string_view key, std::string* field, std::vector<std::string> choices,
               std::string_view help);
  // A size: a plain number of bytes, or with a unit: KiB MiB GiB TiB (also K M G T), KB MB GB TB.
  void AddBytes(std::string_view key, uint64_t* field, std::string_view help);
  // A duration such as "250ms", "30s", "1h30m".
  void AddDuration(std::string_view key, absl::Duration* field, std::string_view help);
  // A YAML sequence in the file; comma-separated in environment variables and flags.
  void AddStringList(std::string_view key, std::vector<std::string>* field, std::string_view help);

  // Applies the sources in order of precedence. On error the fields may be partly updated; the
  // caller should not start.
  absl::Status Load(const ConfigSources& sources);

  // The effective configuration as YAML that Load() accepts back. With `annotate`, each value
  // carries a comment with its help text and where it came from.
  std::string Render(bool annotate) const;

  // Where the current value of `key` came from; NotFound for an unknown key.
  absl::StatusOr<ConfigSource> SourceOf(std::string_view key) const;

  static std::string EnvName(std::string_view key);

 private:
  struct Option;
  void Add(std::unique_ptr<Option> option);
  Option* Find(std::string_view key) const;
  std::string Suggest(std::string_view key) const;
  absl::Status LoadFile(const std::string& path);

  std::vector<std::unique_ptr<Option>> options_;
};

// Parsers shared with flags that are not part of a schema.
absl::StatusOr<uint64_t> ParseBytes(std::string_view text);
std::string FormatBytes(uint64_t bytes);

}  // namespace strata
