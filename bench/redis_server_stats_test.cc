#include "bench/redis_server_stats.h"

#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace bench {
namespace {

using ::testing::HasSubstr;

constexpr char kBefore[] =
    "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.000000\r\n"
    "used_cpu_sys_children:9.000000\r\n\r\n# Commandstats\r\n"
    "cmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n"
    "cmdstat_hget:calls=100,usec=50,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n"
    "cmdstat_info:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n";
constexpr char kAfter[] =
    "# CPU\r\nused_cpu_sys:2.000000\r\nused_cpu_user:3.500000\r\n"
    "used_cpu_sys_children:9.000000\r\n\r\n# Commandstats\r\n"
    "cmdstat_evalsha:calls=20,usec=200,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n"
    "cmdstat_hget:calls=2100,usec=50,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n"
    "cmdstat_config|resetstat:calls=1,usec=9,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n"
    "cmdstat_info:calls=9,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n";

TEST(RedisServerStatsTest, ParsesCpuAndCommandCalls) {
  const ServerSnapshot s = ParseServerInfo(kBefore, absl::UnixEpoch());
  EXPECT_TRUE(s.ok);
  EXPECT_DOUBLE_EQ(s.cpu_seconds, 3.5);  // user + sys, not the children's
  EXPECT_EQ(s.calls.at("evalsha"), 10);
  EXPECT_EQ(s.calls.at("hget"), 100);
  EXPECT_EQ(s.calls.at("info"), 3);
}

TEST(RedisServerStatsTest, NotOkWithoutTheCpuSection) {
  EXPECT_FALSE(ParseServerInfo("ERR unknown\r\n", absl::UnixEpoch()).ok);
}

TEST(RedisServerStatsTest, PrintsPerMessageCostsOfThePhase) {
  const ServerSnapshot before = ParseServerInfo(kBefore, absl::UnixEpoch());
  const ServerSnapshot after = ParseServerInfo(kAfter, absl::UnixEpoch() + absl::Seconds(4));
  testing::internal::CaptureStdout();
  PrintServerPhase("consume", 1000, before, after);
  const std::string line = testing::internal::GetCapturedStdout();
  // 2.0 s of CPU over 1,000 messages in 4 s; 2,001 commands (INFO left out), 10 scripts.
  EXPECT_THAT(line, HasSubstr("server phase=consume msgs=1000 secs=4.000 cpu_s=2.000 "
                              "cpu_us_per_msg=2000.0 busy=0.50 cmds_per_msg=2.00 "
                              "scripts_per_msg=0.010 top=hget:2.00,evalsha:0.01,"
                              "config|resetstat:0.00\n"));
}

}  // namespace
}  // namespace bench
