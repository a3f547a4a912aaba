#include "tests/testing/tls_certs.h"

#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"

namespace bus::testing {
namespace {

// `openssl verify` with `args`: true when it accepts.
bool Verifies(const std::string& args) {
  auto child = ChildProcess::Start({"sh", "-c", absl::StrCat("openssl verify ", args)});
  if (!child.ok()) return false;
  absl::StatusOr<int> status = (*child)->Wait(absl::Seconds(30));
  return status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
}

TEST(TlsCertsTest, EachCertificateIsGoodOrBadForTheReasonItsNameSays) {
  const std::string dir = MakeTempDir("tls-certs");
  absl::StatusOr<TestCertificates> c = MakeTestCertificates(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(
      Verifies(absl::StrCat("-CAfile ", c->ca_cert, " -verify_ip 127.0.0.1 ", c->server_cert)));
  EXPECT_TRUE(Verifies(
      absl::StrCat("-CAfile ", c->ca_cert, " -verify_hostname localhost ", c->server_cert)));
  EXPECT_TRUE(
      Verifies(absl::StrCat("-CAfile ", c->ca_cert, " -purpose sslclient ", c->client_cert)));
  EXPECT_FALSE(Verifies(absl::StrCat("-CAfile ", c->other_ca_cert, " ", c->server_cert)));
  EXPECT_FALSE(Verifies(
      absl::StrCat("-CAfile ", c->ca_cert, " -verify_hostname localhost ", c->wrong_host_cert)));
  EXPECT_TRUE(Verifies(absl::StrCat("-CAfile ", c->ca_cert, " ", c->wrong_host_cert)));
  EXPECT_FALSE(Verifies(absl::StrCat("-CAfile ", c->ca_cert, " ", c->expired_cert)));
  EXPECT_FALSE(Verifies(absl::StrCat("-CAfile ", c->ca_cert, " ", c->untrusted_client_cert)));
  EXPECT_TRUE(Verifies(absl::StrCat("-CAfile ", c->other_ca_cert, " ", c->untrusted_client_cert)));
  RemoveTree(dir);
}

TEST(TlsCertsTest, AMissingDirectoryIsAnErrorNamingTheFile) {
  absl::StatusOr<TestCertificates> c = MakeTestCertificates("/nonexistent/dir");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsInternal(c.status()));
  EXPECT_NE(c.status().message().find("/nonexistent/dir/ca.cnf"), std::string::npos);
}

}  // namespace
}  // namespace bus::testing
