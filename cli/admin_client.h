// What the admin commands (`strata admin cache …`, `strata admin scheduler …`) share: flags, the
// client that finds the address and token and makes the calls, exit codes and JSON output.
//
// Exit codes: 0 ok · 1 the call failed · 2 bad usage or invalid argument · 3 refused (no or wrong
// admin token) · 4 not found / not configured · 5 server unreachable.
#pragma once

#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/strata_config.h"
#include "common/file_util.h"
#include "common/strings.h"

namespace strata::cli {

struct AdminFlags {
  ConfigFlags config;
  std::string address;     // empty: the service's listen address in the config
  std::string token_file;  // empty: cluster.admin_token_file, else $STRATA_ADMIN_TOKEN
  bool json = false;
};

inline int AdminExitCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return 3;
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return 4;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 5;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return 2;
    default:
      return 1;
  }
}

// Proto3 JSON of a response (bytes fields are base64), for --json.
inline void PrintJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  std::cout << out;
}

// A client of one admin service (`Service` is the generated gRPC service class). Every failure
// exits through Fail() with the code above.
template <typename Service>
class AdminClient {
 public:
  // `default_address` picks the service's address from the config; `what` prefixes errors.
  AdminClient(const AdminFlags& flags, std::string (*default_address)(const StrataConfig&),
              std::string what, std::chrono::seconds timeout)
      : json_(flags.json), what_(std::move(what)), timeout_(timeout) {
    StrataConfig config;
    ConfigSchema schema;
    config.Register(schema);
    if (absl::Status st =
            schema.Load({.file = flags.config.file, .overrides = flags.config.overrides});
        !st.ok()) {
      Fail(2, StrCat("config: ", st.message()));
    }
    const std::string address = flags.address.empty() ? default_address(config) : flags.address;
    const std::string token_file =
        flags.token_file.empty() ? config.cluster.admin_token_file : flags.token_file;
    if (const char* env = std::getenv("STRATA_ADMIN_TOKEN"); env && token_file.empty()) {
      token_ = env;
    } else if (!token_file.empty()) {
      auto token = ReadSecretFile(token_file, "admin token");
      if (!token.ok()) Fail(2, std::string(token.status().message()));
      token_ = *std::move(token);
    }
    stub_ = Service::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }

  template <typename Req, typename Resp, typename Method>
  Resp Call(Method method, const Req& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
    if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
    Resp resp;
    const grpc::Status st = ((*stub_).*method)(&ctx, req, &resp);
    if (!st.ok()) Fail(AdminExitCode(st.error_code()), StrCat(what_, ": ", st.error_message()));
    return resp;
  }

  bool json() const { return json_; }

 private:
  bool json_;
  std::string what_;
  std::chrono::seconds timeout_;
  std::string token_;
  std::unique_ptr<typename Service::Stub> stub_;
};

}  // namespace strata::cli
