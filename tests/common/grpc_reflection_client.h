// Test helper: the services a gRPC server lists through server reflection (the
// grpc.reflection.v1alpha API that grpcurl uses), asked over a generic call so that no
// reflection client library is needed: a ListServices request in, the names out of the reply.
#pragma once

#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/strings.h"

namespace strata::grpc_test {

inline absl::StatusOr<std::vector<std::string>> ListGrpcServices(const std::string& target) {
  grpc::GenericStub stub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  // Each step waits for its own completion; `ok` false means the stream broke.
  auto step = [&cq](auto&& op) {
    op();
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok;
  };
  // ServerReflectionRequest{list_services = ""}: field 7, length-delimited, empty.
  grpc::Slice request_bytes(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&request_bytes, 1);
  grpc::ByteBuffer reply;
  const bool sent = step([&] { call->StartCall(nullptr); }) &&
                    step([&] { call->Write(request, nullptr); }) &&
                    step([&] { call->WritesDone(nullptr); });
  const bool read = sent && step([&] { call->Read(&reply, nullptr); });
  grpc::Status status;
  step([&] { call->Finish(&status, nullptr); });
  if (!status.ok()) return absl::UnavailableError(StrCat("reflection: ", status.error_message()));
  if (!read) return absl::UnavailableError("reflection: no reply");
  std::vector<grpc::Slice> slices;
  if (!reply.Dump(&slices).ok()) return absl::InternalError("reflection: unreadable reply");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // ServerReflectionResponse.list_services_response (6) -> repeated service (1) -> name (1).
  auto fields = [](const std::string& b, int number) {
    google::protobuf::UnknownFieldSet set;
    std::vector<std::string> out;
    if (!set.ParseFromString(b)) return out;
    for (int i = 0; i < set.field_count(); ++i) {
      if (set.field(i).number() == number &&
          set.field(i).type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
        out.push_back(set.field(i).length_delimited());
      }
    }
    return out;
  };
  std::vector<std::string> names;
  for (const std::string& list : fields(bytes, 6)) {
    for (const std::string& service : fields(list, 1)) {
      for (const std::string& name : fields(service, 1)) names.push_back(name);
    }
  }
  return names;
}

}  // namespace strata::grpc_test
