// Pure functions: NsqOptions' validation (each bad field named), the defaults filled in, and the
// names of the publish policies and codecs. No nsqd.

#include "drivers/nsq/nsq_options.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bus {
namespace {

using ::testing::HasSubstr;

NsqOptions Valid() { return NsqOptions{.nsqd_tcp_addresses = {"127.0.0.1:4150"}}; }

TEST(NsqOptionsTest, DefaultsWithOneAddressAreValid) {
  EXPECT_TRUE(ValidateNsqOptions(Valid()).ok());
  EXPECT_FALSE(ValidateNsqOptions({}).ok());  // no address at all
}

TEST(NsqOptionsTest, TheSharedVocabularyHasNsqDefaults) {
  const NsqOptions o;
  EXPECT_FALSE(o.tls.enabled);
  EXPECT_TRUE(o.connection.tls_required);
  EXPECT_EQ(o.connection.heartbeat_interval, absl::Seconds(30));
  EXPECT_EQ(o.timeouts.connect, absl::Seconds(5));
  EXPECT_EQ(o.timeouts.request, absl::Seconds(10));
  EXPECT_EQ(o.reconnect_backoff.jitter, BackoffPolicy::Jitter::kEqual);
}

TEST(NsqOptionsTest, EachBadFieldIsNamed) {
  struct Case {
    const char* field;
    void (*mutate)(NsqOptions&);
  };
  const Case cases[] = {
      {"nsqd_tcp_addresses", [](NsqOptions& o) { o.nsqd_tcp_addresses = {"no-port"}; }},
      {"lookupd_http_addresses", [](NsqOptions& o) { o.lookupd_http_addresses = {"h:1/path"}; }},
      {"discovery.nsqd_http_addresses",
       [](NsqOptions& o) { o.discovery.nsqd_http_addresses = {"ftp://h:1"}; }},
      {"queue_channel", [](NsqOptions& o) { o.queue_channel = ""; }},
      {"auth.user_agent", [](NsqOptions& o) { o.auth.user_agent = ""; }},
      {"tls", [](NsqOptions& o) { o.tls = {.enabled = true, .cert_file = "c.pem"}; }},
      {"tls", [](NsqOptions& o) { o.tls.ca_dir = "/etc/ssl/certs"; }},  // without enabled
      {"tls", [](NsqOptions& o) { o.tls.server_name = "nsqd"; }},
      {"tls.min_version",
       [](NsqOptions& o) {
         o.tls.enabled = true;
         o.tls.min_version = static_cast<TlsOptions::Version>(7);
       }},
      {"compression.deflate_level", [](NsqOptions& o) { o.compression.deflate_level = 10; }},
      {"consuming.sample_rate", [](NsqOptions& o) { o.consuming.sample_rate = 100; }},
      {"consuming.output_buffer_size", [](NsqOptions& o) { o.consuming.output_buffer_size = -1; }},
      {"publishing.use_lookupd", [](NsqOptions& o) { o.publishing.use_lookupd = true; }},
      {"publishing.connections", [](NsqOptions& o) { o.publishing.connections = 0; }},
      {"io_threads", [](NsqOptions& o) { o.io_threads = 65; }},
      {"publishing.timeout", [](NsqOptions& o) { o.publishing.timeout = absl::ZeroDuration(); }},
      {"timeouts.connect", [](NsqOptions& o) { o.timeouts.connect = absl::ZeroDuration(); }},
      {"timeouts.request", [](NsqOptions& o) { o.timeouts.request = -absl::Seconds(1); }},
      {"consuming.close_timeout",
       [](NsqOptions& o) { o.consuming.close_timeout = -absl::Seconds(1); }},
      {"connection.heartbeat_interval",
       [](NsqOptions& o) { o.connection.heartbeat_interval = absl::Milliseconds(999); }},
      {"limits.max_defer", [](NsqOptions& o) { o.limits.max_defer = absl::Milliseconds(10); }},
      {"limits.max_message_bytes", [](NsqOptions& o) { o.limits.max_message_bytes = 0; }},
      {"reconnect_backoff.initial",
       [](NsqOptions& o) { o.reconnect_backoff.initial = absl::ZeroDuration(); }},
      {"reconnect_backoff.max",
       [](NsqOptions& o) { o.reconnect_backoff.max = absl::Milliseconds(1); }},
  };
  for (const Case& c : cases) {
    NsqOptions o = Valid();
    c.mutate(o);
    const absl::Status s = ValidateNsqOptions(o);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.field << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("NsqOptions.", c.field))) << c.field;
  }
}

TEST(NsqOptionsTest, TlsSettingsServeHttpsAddressesWithoutEnabled) {
  NsqOptions o = Valid();
  o.lookupd_http_addresses = {"https://lookupd:4161"};
  o.tls.ca_file = "/etc/nsq/ca.pem";
  o.tls.ca_dir = "/etc/nsq/cas";
  EXPECT_TRUE(ValidateNsqOptions(o).ok());
}

TEST(NsqOptionsTest, DefaultsFillTheEnvironment) {
  const NsqOptions o = WithNsqDefaults(Valid());
  EXPECT_FALSE(o.auth.client_id.empty());
  EXPECT_NE(o.logger, nullptr);
  EXPECT_NE(o.clock, nullptr);
  EXPECT_NE(o.random, nullptr);
}

TEST(NsqOptionsTest, PolicyAndCodecNamesRoundTrip) {
  for (NsqPublishPolicy p : {NsqPublishPolicy::kPrefer, NsqPublishPolicy::kSpread}) {
    EXPECT_EQ(*ParseNsqPublishPolicy(NsqPublishPolicyName(p)), p);
  }
  for (NsqCompression c :
       {NsqCompression::kNone, NsqCompression::kSnappy, NsqCompression::kDeflate}) {
    EXPECT_EQ(*ParseNsqCompression(NsqCompressionName(c)), c);
  }
  EXPECT_FALSE(ParseNsqPublishPolicy("random").ok());
  EXPECT_FALSE(ParseNsqCompression("lz4").ok());
}

}  // namespace
}  // namespace bus
