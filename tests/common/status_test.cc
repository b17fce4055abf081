#include "common/status.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "common/grpc_status.h"

namespace strata {
namespace {

absl::Status FailsWith(absl::StatusCode code) { return absl::Status(code, "inner"); }

absl::StatusOr<int> Half(int v) {
  if (v % 2 != 0) return absl::InvalidArgumentError("odd");
  return v / 2;
}

absl::Status UseReturnIfError(absl::StatusCode code) {
  RETURN_IF_ERROR(FailsWith(code));
  return absl::OkStatus();
}

absl::Status UseReturnIfErrorWith(const std::string& path) {
  RETURN_IF_ERROR_WITH(FailsWith(absl::StatusCode::kDataLoss), "reading ", path);
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int v) {
  ASSIGN_OR_RETURN(int half, Half(v));
  ASSIGN_OR_RETURN_WITH(int quarter, Half(half), "second halving of ", v);
  return quarter;
}

TEST(StatusTest, ReturnIfErrorPassesStatusThrough) {
  EXPECT_TRUE(UseReturnIfError(absl::StatusCode::kOk).ok());
  EXPECT_EQ(UseReturnIfError(absl::StatusCode::kNotFound).code(), absl::StatusCode::kNotFound);
}

TEST(StatusTest, WithFormsAddContextAndKeepCode) {
  const absl::Status st = UseReturnIfErrorWith("/ssd/slots.0");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "reading /ssd/slots.0: inner");
  EXPECT_TRUE(absl::IsDataLoss(st));
}

TEST(StatusTest, AssignOrReturn) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(3).status().message(), "odd");
  EXPECT_EQ(Quarter(6).status().message(), "second halving of 6: odd");
}

TEST(StatusTest, AnnotateKeepsPayloads) {
  absl::Status st = absl::UnavailableError("peer gone");
  st.SetPayload("strata/peer", absl::Cord("10.0.0.1"));
  const absl::Status annotated = Annotate(st, "fetching block");
  EXPECT_EQ(annotated.message(), "fetching block: peer gone");
  EXPECT_EQ(annotated.GetPayload("strata/peer").value(), "10.0.0.1");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(StatusTest, ErrnoMapping) {
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EIO, "read").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ErrnoToStatus(ECONNRESET, "recv").code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(ErrnoToStatus(0, "x").ok());
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write slot").message(), "write slot: No space left on device");
  EXPECT_TRUE(IsRetryable(ErrnoToStatus(ECONNRESET, "")));
  EXPECT_FALSE(IsRetryable(ErrnoToStatus(ENOSPC, "")));
}

TEST(StatusTest, GrpcRoundTrip) {
  for (int c = 0; c <= 16; ++c) {
    const absl::Status st(static_cast<absl::StatusCode>(c), c == 0 ? "" : "msg");
    const grpc::Status g = ToGrpcStatus(st);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(FromGrpcStatus(g), st);
  }
}

}  // namespace
}  // namespace strata
