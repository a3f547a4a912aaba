// Test certificates for the TLS suites, made at run time with the `openssl` command (no key is
// ever committed): a CA, a server certificate for localhost and 127.0.0.1, a client
// certificate for mutual TLS, and the bad ones each failure test needs (signed by another CA,
// for another host name, expired). Keys are EC P-256, unencrypted, readable by the owner only.
//
//   absl::StatusOr<TestCertificates> certs = MakeTestCertificates(MakeTempDir("tls"));
//   redis-server --tls-port ... --tls-cert-file certs->server_cert ...
//
// Thread-safety: MakeTestCertificates may run concurrently in different directories.

#ifndef TESTS_TESTING_TLS_CERTS_H_
#define TESTS_TESTING_TLS_CERTS_H_

#include <string>

#include "absl/status/statusor.h"

namespace bus::testing {

// Paths of PEM files in one directory.
struct TestCertificates {
  std::string dir{};
  // The CA that signed server_*, client_*, wrong_host_* and expired_*; valid from an hour ago
  // for two days.
  std::string ca_cert{};
  // CN localhost, SAN DNS:localhost and IP:127.0.0.1; server and client auth.
  std::string server_cert{}, server_key{};
  // CN bus-test-client; client auth.
  std::string client_cert{}, client_key{};
  // client_key encrypted (PKCS#8, AES-256) with the passphrase client_key_password.
  std::string client_key_encrypted{}, client_key_password{};
  // A CA that signed nothing here: a client trusting only it refuses every server above.
  std::string other_ca_cert{};
  // Signed by `ca_cert` for DNS:not-this-host.example only: a host name mismatch.
  std::string wrong_host_cert{}, wrong_host_key{};
  // Signed by `ca_cert` for localhost and 127.0.0.1, valid only on 2024-01-01.
  std::string expired_cert{}, expired_key{};
  // A certificate signed by `other_ca_cert`, client auth: refused by a server trusting ca_cert.
  std::string untrusted_client_cert{}, untrusted_client_key{};
};

// Makes the files in `dir` (which must exist). Internal with openssl's output when a command
// fails.
absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir);

}  // namespace bus::testing

#endif  // TESTS_TESTING_TLS_CERTS_H_
