// TLS settings for the Redis tests: the binary's test certificates (tls_certs.h, made once in
// a temporary directory) and the server and client settings built from them.
//
//   absl::StatusOr<const TestCertificates*> certs = SharedTestCertificates();
//   RedisServer::Start({.tls = RedisServerTls(**certs, /*auth_clients=*/true)});
//   options.tls = RedisClientTls(**certs);
//
// Thread-safety: SharedTestCertificates is safe from any thread.

#ifndef TESTS_TESTING_REDIS_TLS_H_
#define TESTS_TESTING_REDIS_TLS_H_

#include "absl/status/statusor.h"
#include "common/redis/redis_options.h"
#include "tests/testing/redis_server.h"
#include "tests/testing/tls_certs.h"

namespace bus::testing {

// Made by the first call; the same error on every call if openssl failed.
absl::StatusOr<const TestCertificates*> SharedTestCertificates();

// A TLS-only server with the server certificate for localhost and 127.0.0.1, trusting the CA;
// `auth_clients`: a client certificate is required. Cli() presents the client certificate.
RedisServerOptions::Tls RedisServerTls(const TestCertificates& certs, bool auth_clients);

// TLS on, trusting the test CA, presenting the client certificate.
TlsOptions RedisClientTls(const TestCertificates& certs);

}  // namespace bus::testing

#endif  // TESTS_TESTING_REDIS_TLS_H_
