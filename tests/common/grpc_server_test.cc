// StartGrpcServer: the daemons' common gRPC setup binds, serves reflection and reports a busy
// address clearly.
#include "common/grpc_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/strings.h"
#include "tests/common/grpc_reflection_client.h"

namespace strata {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

TEST(GrpcServerTest, BindsAFreePortAndServesReflection) {
  int port = -1;
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartGrpcServer("127.0.0.1:0", {}, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT(port, 0);
  absl::StatusOr<std::vector<std::string>> names =
      grpc_test::ListGrpcServices(StrCat("127.0.0.1:", port));
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, Contains("grpc.reflection.v1alpha.ServerReflection"));
  (*server)->Shutdown();
}

TEST(GrpcServerTest, ABusyAddressIsUnavailableAndNamesIt) {
  int port = 0;
  absl::StatusOr<std::unique_ptr<grpc::Server>> first = StartGrpcServer("127.0.0.1:0", {}, &port);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = StrCat("127.0.0.1:", port);
  int second_port = -1;
  absl::StatusOr<std::unique_ptr<grpc::Server>> second = StartGrpcServer(address, {}, &second_port);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(address));
  EXPECT_EQ(second_port, 0);
  (*first)->Shutdown();
}

}  // namespace
}  // namespace strata
