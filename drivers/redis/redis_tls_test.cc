// TLS against real TLS-only redis-servers that each test starts (certificates made at run time
// by tests/testing/tls_certs.h): what works, and each failure as a status naming what to fix.
// The timeouts are long on purpose: a failure must be reported for its reason, at once, and
// never as a connect or request deadline.

#include "tests/testing/redis_tls.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "drivers/redis/redis_driver.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"
#include "tests/testing/redis_server.h"

namespace bus::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class RedisTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<const TestCertificates*> certs = SharedTestCertificates();
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
  }

  // A TLS-only server; `cert`/`key` replace the good server certificate when set.
  std::unique_ptr<RedisServer> Server(bool auth_clients, const std::string& cert = "",
                                      const std::string& key = "",
                                      std::vector<std::string> extra_args = {}) {
    RedisServerOptions o;
    o.tls = RedisServerTls(*certs_, auth_clients);
    if (!cert.empty()) {
      o.tls->cert_file = cert;
      o.tls->key_file = key;
    }
    o.extra_args = std::move(extra_args);
    absl::StatusOr<std::unique_ptr<RedisServer>> s = RedisServer::Start(std::move(o));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  RedisOptions Client(int port) const {
    RedisOptions o;
    o.port = port;
    o.tls = RedisClientTls(*certs_);
    o.timeouts.connect = absl::Seconds(30);
    o.timeouts.request = absl::Seconds(30);
    return o;
  }

  // Ping through a new driver: its status.
  static absl::Status Ping(const RedisOptions& o) {
    absl::StatusOr<std::shared_ptr<Driver>> d = NewRedisDriver(o);
    if (!d.ok()) return d.status();
    return (*d)->Ping(absl::Seconds(30));
  }

  const TestCertificates* certs_ = nullptr;
};

// An encrypted client key (openssl pkcs8 -v2 aes-256-cbc, made at run time) with its passphrase
// in tls.key_password; without it, or with a wrong one, the options are refused naming the
// field, before any connection (and OpenSSL never prompts on the terminal).
TEST_F(RedisTlsTest, AnEncryptedClientKeyNeedsItsPassphrase) {
  std::unique_ptr<RedisServer> server = Server(/*auth_clients=*/true);
  ASSERT_NE(server, nullptr);
  RedisOptions o = Client(server->port());
  o.tls.key_file = certs_->client_key_encrypted;
  o.tls.key_password = certs_->client_key_password;
  EXPECT_TRUE(Ping(o).ok()) << Ping(o);

  o.tls.key_password.clear();
  const absl::Status none = Ping(o);
  EXPECT_TRUE(absl::IsInvalidArgument(none)) << none;
  EXPECT_THAT(std::string(none.message()), HasSubstr("RedisOptions.tls.key_password"));

  o.tls.key_password = "not-the-passphrase";
  const absl::Status wrong = Ping(o);
  EXPECT_TRUE(absl::IsInvalidArgument(wrong)) << wrong;
  EXPECT_THAT(std::string(wrong.message()), HasSubstr("wrong RedisOptions.tls.key_password"));
  EXPECT_THAT(std::string(wrong.message()), Not(HasSubstr("not-the-passphrase")));
}

TEST_F(RedisTlsTest, MutualTlsWorksByAddressAndByName) {
  std::unique_ptr<RedisServer> server = Server(/*auth_clients=*/true);
  ASSERT_NE(server, nullptr);
  RedisOptions o = Client(server->port());
  EXPECT_TRUE(Ping(o).ok()) << Ping(o);
  o.host = "localhost";
  EXPECT_TRUE(Ping(o).ok()) << Ping(o);
  // Database, password and TLS together: AUTH and SELECT run inside TLS.
  o.db = 3;
  EXPECT_TRUE(Ping(o).ok()) << Ping(o);
  o.tls.min_version = TlsOptions::Version::kTls13;
  EXPECT_TRUE(Ping(o).ok()) << Ping(o);
}

TEST_F(RedisTlsTest, AServerCertificateFromAnotherCaIsRefused) {
  std::unique_ptr<RedisServer> server = Server(false);
  ASSERT_NE(server, nullptr);
  RedisOptions o = Client(server->port());
  o.tls.ca_file = certs_->other_ca_cert;
  const absl::Status st = Ping(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("the server's certificate was refused: "));
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("; set tls.ca_file (URL: tls_ca_file) to the CA that signed"));
  EXPECT_THAT(std::string(st.message()), HasSubstr(absl::StrCat("127.0.0.1:", server->port())));
}

TEST_F(RedisTlsTest, AHostNameMismatchIsRefusedUnlessServerNameNamesTheCertificate) {
  std::unique_ptr<RedisServer> server =
      Server(false, certs_->wrong_host_cert, certs_->wrong_host_key);
  ASSERT_NE(server, nullptr);
  RedisOptions o = Client(server->port());
  absl::Status st = Ping(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("IP address mismatch"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("set tls.server_name"));
  o.host = "localhost";
  st = Ping(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("hostname mismatch"));
  o.tls.server_name = "not-this-host.example";
  EXPECT_TRUE(Ping(o).ok()) << Ping(o);
}

TEST_F(RedisTlsTest, AnExpiredServerCertificateIsRefused) {
  std::unique_ptr<RedisServer> server = Server(false, certs_->expired_cert, certs_->expired_key);
  ASSERT_NE(server, nullptr);
  const absl::Status st = Ping(Client(server->port()));
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("certificate has expired; renew the server's certificate"));
}

// The loudly named escape hatch: encrypted, but nothing about the server is checked.
TEST_F(RedisTlsTest, InsecureSkipVerifyAcceptsAnyServerCertificate) {
  std::unique_ptr<RedisServer> server = Server(false, certs_->expired_cert, certs_->expired_key);
  ASSERT_NE(server, nullptr);
  RedisOptions o = Client(server->port());
  o.tls.ca_file = certs_->other_ca_cert;
  o.tls.insecure_skip_verify = true;
  EXPECT_TRUE(Ping(o).ok()) << Ping(o);
}

TEST_F(RedisTlsTest, AMissingClientCertificateIsNamed) {
  std::unique_ptr<RedisServer> server = Server(/*auth_clients=*/true);
  ASSERT_NE(server, nullptr);
  RedisOptions o = Client(server->port());
  o.tls.cert_file.clear();
  o.tls.key_file.clear();
  const absl::Status st = Ping(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("requires a client certificate: set tls.cert_file"));
}

TEST_F(RedisTlsTest, AClientCertificateFromAnotherCaIsRefused) {
  std::unique_ptr<RedisServer> server = Server(/*auth_clients=*/true);
  ASSERT_NE(server, nullptr);
  RedisOptions o = Client(server->port());
  o.tls.cert_file = certs_->untrusted_client_cert;
  o.tls.key_file = certs_->untrusted_client_key;
  const absl::Status st = Ping(o);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("refused this client's certificate"));
}

TEST_F(RedisTlsTest, APlaintextClientOnTheTlsPortIsToldToUseRediss) {
  std::unique_ptr<RedisServer> server = Server(false);
  ASSERT_NE(server, nullptr);
  RedisOptions o;
  o.port = server->port();
  o.timeouts.connect = absl::Seconds(30);
  // A send retries Unavailable within the request timeout; Ping does not retry.
  o.timeouts.request = absl::Seconds(30);
  const absl::Status st = Ping(o);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("if it accepts TLS only, use rediss://"));
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr("within")));
}

// A plaintext server reads the ClientHello as an inline command: it answers an error when the
// hello happens to hold a newline (OpenSSL then sees no TLS record), else it waits for one.
// Either way the status names the fix; the wait ends at the connect deadline.
TEST_F(RedisTlsTest, ATlsClientOnAPlaintextPortIsToldToUseRedis) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  RedisOptions o = Client((*server)->port());
  o.timeouts.connect = absl::Seconds(1);
  for (int i = 0; i < 5; ++i) {
    const absl::Status st = Ping(o);
    if (absl::IsFailedPrecondition(st)) {
      EXPECT_THAT(std::string(st.message()),
                  HasSubstr("the server does not speak TLS on this port"));
    } else {
      EXPECT_TRUE(absl::IsUnavailable(st)) << st;
      EXPECT_THAT(std::string(st.message()),
                  HasSubstr("no answer within 1s (in the TLS handshake: if this is the server's "
                            "plaintext port"));
    }
    EXPECT_THAT(std::string(st.message()), HasSubstr("use redis://"));
  }
}

TEST_F(RedisTlsTest, NoCommonTlsVersionIsNamed) {
  std::unique_ptr<RedisServer> server = Server(false, "", "", {"--tls-protocols", "TLSv1.2"});
  ASSERT_NE(server, nullptr);
  RedisOptions o = Client(server->port());
  EXPECT_TRUE(Ping(o).ok()) << Ping(o);
  o.tls.min_version = TlsOptions::Version::kTls13;
  const absl::Status st = Ping(o);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("no TLS version in common"));
}

TEST_F(RedisTlsTest, AnUnreadableCertificateFailsTheFactory) {
  RedisOptions o = Client(6379);
  o.tls.cert_file = "/nonexistent/client.pem";
  absl::StatusOr<std::shared_ptr<Driver>> d = NewRedisDriver(o);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr("RedisOptions.tls.cert_file \"/nonexistent"));
}

}  // namespace
}  // namespace bus::testing
