#include "tests/testing/redis_tls.h"

#include "tests/testing/process.h"

namespace bus::testing {

absl::StatusOr<const TestCertificates*> SharedTestCertificates() {
  static const absl::StatusOr<TestCertificates>* certs =
      new absl::StatusOr<TestCertificates>(MakeTestCertificates(MakeTempDir("redis-tls")));
  if (!certs->ok()) return certs->status();
  return &**certs;
}

RedisServerOptions::Tls RedisServerTls(const TestCertificates& certs, bool auth_clients) {
  return {.cert_file = certs.server_cert,
          .key_file = certs.server_key,
          .ca_cert_file = certs.ca_cert,
          .auth_clients = auth_clients,
          .client_cert_file = certs.client_cert,
          .client_key_file = certs.client_key};
}

TlsOptions RedisClientTls(const TestCertificates& certs) {
  return {.enabled = true,
          .ca_file = certs.ca_cert,
          .cert_file = certs.client_cert,
          .key_file = certs.client_key};
}

}  // namespace bus::testing
