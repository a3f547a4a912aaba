#include "tests/testing/tls_certs.h"

#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/process.h"

namespace bus::testing {
namespace {

// `openssl ca` signs with explicit start and end dates, which `openssl x509 -req` of OpenSSL
// 3.0 cannot; the sections are the certificates' extensions.
constexpr char kCaConfig[] = R"([ca]
default_ca = test_ca
[test_ca]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = any
copy_extensions = none
unique_subject = no
[any]
commonName = supplied
[server]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
[wrong_host]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:not-this-host.example
[client]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
)";

absl::Status WriteFile(const std::string& path, absl::string_view text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs openssl with `args` in `dir` (through `sh -c 'cd dir && ...'`, since `openssl ca`
// resolves its database relative to the working directory).
absl::Status Openssl(const std::string& dir, const std::string& args) {
  const std::string log = absl::StrCat(dir, "/openssl.log");
  auto child = ChildProcess::Start(
      {"sh", "-c", absl::StrCat("cd '", dir, "' && umask 077 && openssl ", args)}, log);
  if (!child.ok()) return child.status();
  absl::StatusOr<int> status = (*child)->Wait(absl::Seconds(60));
  if (!status.ok()) return status.status();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat("openssl ", args, " failed: ", ReadFile(log)));
  }
  return absl::OkStatus();
}

absl::Status NewKeyAndRequest(const std::string& dir, const std::string& name,
                              const std::string& cn) {
  return Openssl(dir, absl::StrCat("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                                   "-keyout ",
                                   name, ".key -out ", name, ".csr -subj /CN=", cn));
}

std::string Date(absl::Time t) { return absl::FormatTime("%Y%m%d%H%M%SZ", t, absl::UTCTimeZone()); }

absl::Status Sign(const std::string& dir, const std::string& ca, const std::string& name,
                  const std::string& extensions, absl::Time start, absl::Time end) {
  return Openssl(
      dir, absl::StrCat("ca -batch -config ca.cnf -cert ", ca, ".crt -keyfile ", ca, ".key -in ",
                        name, ".csr -out ", name, ".crt -extensions ", extensions, " -startdate ",
                        Date(start), " -enddate ", Date(end), " -notext"));
}

absl::Status NewCa(const std::string& dir, const std::string& name, const std::string& cn) {
  return Openssl(dir, absl::StrCat("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                                   "-nodes -keyout ",
                                   name, ".key -out ", name, ".crt -days 3 -subj /CN=", cn));
}

}  // namespace

absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir) {
  if (absl::Status st = WriteFile(dir + "/ca.cnf", kCaConfig); !st.ok()) return st;
  if (absl::Status st = WriteFile(dir + "/index.txt", ""); !st.ok()) return st;
  if (absl::Status st = WriteFile(dir + "/serial", "01\n"); !st.ok()) return st;
  const absl::Time now = absl::Now();  // certificates are checked against the real time
  const absl::Time start = now - absl::Hours(1);
  const absl::Time end = now + absl::Hours(48);
  const absl::Time expired_start = absl::FromCivil(absl::CivilDay(2024, 1, 1), absl::UTCTimeZone());
  struct Step {
    std::string name, cn, ca, extensions;
    absl::Time start, end;
  };
  const std::vector<Step> steps = {
      {"server", "localhost", "ca", "server", start, end},
      {"client", "bus-test-client", "ca", "client", start, end},
      {"wrong_host", "not-this-host.example", "ca", "wrong_host", start, end},
      {"expired", "localhost", "ca", "server", expired_start, expired_start + absl::Hours(24)},
      {"untrusted_client", "bus-test-client", "other_ca", "client", start, end},
  };
  if (absl::Status st = NewCa(dir, "ca", "bus-test-ca"); !st.ok()) return st;
  if (absl::Status st = NewCa(dir, "other_ca", "bus-other-ca"); !st.ok()) return st;
  for (const Step& s : steps) {
    if (absl::Status st = NewKeyAndRequest(dir, s.name, s.cn); !st.ok()) return st;
    if (absl::Status st = Sign(dir, s.ca, s.name, s.extensions, s.start, s.end); !st.ok()) {
      return st;
    }
  }
  // A passphrase made per run, so no test depends on a fixed one.
  const std::string password = absl::StrCat("pw-", absl::ToUnixNanos(absl::Now()));
  if (absl::Status st = Openssl(dir, absl::StrCat("pkcs8 -topk8 -v2 aes-256-cbc -in client.key "
                                                  "-out client_encrypted.key -passout pass:",
                                                  password));
      !st.ok()) {
    return st;
  }
  auto path = [&](const std::string& file) { return absl::StrCat(dir, "/", file); };
  TestCertificates c;
  c.dir = dir;
  c.ca_cert = path("ca.crt");
  c.server_cert = path("server.crt");
  c.server_key = path("server.key");
  c.client_cert = path("client.crt");
  c.client_key = path("client.key");
  c.client_key_encrypted = path("client_encrypted.key");
  c.client_key_password = password;
  c.other_ca_cert = path("other_ca.crt");
  c.wrong_host_cert = path("wrong_host.crt");
  c.wrong_host_key = path("wrong_host.key");
  c.expired_cert = path("expired.crt");
  c.expired_key = path("expired.key");
  c.untrusted_client_cert = path("untrusted_client.crt");
  c.untrusted_client_key = path("untrusted_client.key");
  return c;
}

}  // namespace bus::testing
