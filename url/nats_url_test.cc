// nats:// and tls:// URLs: hosts, credentials from the URL and from the environment, stream
// parameters, TLS, and the errors that name the bad part without showing a secret.

#include "url/nats_url.h"

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "url/url.h"

namespace bus {
namespace {

GetEnv EnvOf(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

absl::StatusOr<NatsOptions> Parse(absl::string_view text, const GetEnv& env = EnvOf({})) {
  absl::StatusOr<ParsedUrl> url = ParseUrl(text);
  if (!url.ok()) return url.status();
  return NatsOptionsFromUrl(*url, env);
}

TEST(NatsUrlTest, HostsPortsAndStreamParameters) {
  absl::StatusOr<NatsOptions> o = Parse(
      "nats://n1,n2:4333?stream=ORDERS&replicas=3&storage=memory&max_deliver=5"
      "&request_timeout=2s&subject_prefix=app");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->servers, (std::vector<std::string>{"nats://n1:4222", "nats://n2:4333"}));
  EXPECT_EQ(o->stream.name, "ORDERS");
  EXPECT_EQ(o->stream.replicas, 3);
  EXPECT_EQ(o->stream.storage, NatsOptions::Stream::Storage::kMemory);
  EXPECT_EQ(o->stream.subject_prefix, "app");
  EXPECT_EQ(o->max_deliver, 5);
  EXPECT_EQ(o->timeouts.request, absl::Seconds(2));
  EXPECT_FALSE(o->tls.enabled);
}

TEST(NatsUrlTest, TlsSchemeAndFiles) {
  absl::StatusOr<NatsOptions> o = Parse("tls://h?tls_ca_file=/ca.pem&tls_server_name=nats.local");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->tls.enabled);
  EXPECT_EQ(o->servers[0], "tls://h:4222");
  EXPECT_EQ(o->tls.ca_file, "/ca.pem");
  EXPECT_EQ(o->tls.server_name, "nats.local");
}

TEST(NatsUrlTest, CredentialsFromTheUrlAndTheEnvironment) {
  absl::StatusOr<NatsOptions> o = Parse("nats://app:s3cret@h");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->username, "app");
  EXPECT_EQ(o->password, "s3cret");
  o = Parse("nats://tok3n@h");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->token, "tok3n");
  EXPECT_EQ(RedactedUrl("nats://tok3n@h"), "nats://<redacted>@h");
  EXPECT_FALSE(absl::StrContains(RedactedUrl("nats://app:s3cret@h"), "s3cret"));
  o = Parse("nats://h", EnvOf({{"NATS_TOKEN", "envtok"}}));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->token, "envtok");
  EXPECT_EQ(o->credentials_source, "NATS_TOKEN");
  o = Parse("nats://h", EnvOf({{"NATS_NKEY_SEED_FILE", "/seed.nk"}, {"NATS_NKEY", "UABC"}}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nkey_seed_file, "/seed.nk");
  EXPECT_EQ(o->nkey_public, "UABC");
  o = Parse("nats://h", EnvOf({{"NATS_CREDS", "/u.creds"}}));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->credentials_file, "/u.creds");
}

TEST(NatsUrlTest, BadPartsAreNamed) {
  EXPECT_TRUE(absl::StrContains(Parse("nats://h?replicas=2").status().message(), "replicas"));
  EXPECT_TRUE(absl::StrContains(Parse("nats://h?storage=disk").status().message(), "storage"));
  EXPECT_TRUE(absl::StrContains(Parse("nats://h?nope=1").status().message(), "nope"));
  EXPECT_TRUE(absl::StrContains(Parse("nats://h/x").status().message(), "path"));
  EXPECT_TRUE(absl::IsInvalidArgument(Parse("nats://").status()));
}

}  // namespace
}  // namespace bus
