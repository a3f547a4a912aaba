#include "drivers/kafka/internal/admin.h"

#include <functional>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "drivers/kafka/internal/client.h"

namespace bus::kafka {
namespace {

struct OptionsDeleter {
  void operator()(rd_kafka_AdminOptions_t* o) const { rd_kafka_AdminOptions_destroy(o); }
};
using AdminOptions = std::unique_ptr<rd_kafka_AdminOptions_t, OptionsDeleter>;

AdminOptions NewOptions(rd_kafka_t* rk, rd_kafka_admin_op_t op, int timeout_ms) {
  AdminOptions o(rd_kafka_AdminOptions_new(rk, op));
  char err[256];
  rd_kafka_AdminOptions_set_request_timeout(o.get(), timeout_ms, err, sizeof(err));
  if (op == RD_KAFKA_ADMIN_OP_CREATETOPICS || op == RD_KAFKA_ADMIN_OP_DELETETOPICS) {
    rd_kafka_AdminOptions_set_operation_timeout(o.get(), timeout_ms, err, sizeof(err));
  }
  return o;
}

// Waits for the one result event on `q`.
absl::StatusOr<Event> AwaitResult(rd_kafka_queue_t* q, int timeout_ms, absl::string_view what) {
  Event ev(rd_kafka_queue_poll(q, timeout_ms + 1000));
  if (ev == nullptr) return absl::UnavailableError(absl::StrCat(what, ": no answer from Kafka"));
  if (rd_kafka_event_error(ev.get()) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return ErrorStatus(rd_kafka_event_error(ev.get()), what);
  }
  return ev;
}

}  // namespace

absl::Status Admin::CreateTopics(const std::vector<TopicSpec>& specs) {
  if (specs.empty()) return absl::OkStatus();
  std::vector<rd_kafka_NewTopic_t*> topics;
  char err[512];
  for (const TopicSpec& s : specs) {
    rd_kafka_NewTopic_t* t = rd_kafka_NewTopic_new(
        s.name.c_str(), s.partitions > 0 ? s.partitions : -1,
        s.replication_factor > 0 ? s.replication_factor : -1, err, sizeof(err));
    if (t == nullptr) {
      rd_kafka_NewTopic_destroy_array(topics.data(), topics.size());
      return absl::InvalidArgumentError(absl::StrCat("Kafka topic ", s.name, ": ", err));
    }
    if (s.compacted) rd_kafka_NewTopic_set_config(t, "cleanup.policy", "compact");
    topics.push_back(t);
  }
  Queue q(rd_kafka_queue_new(rk_));
  AdminOptions opts = NewOptions(rk_, RD_KAFKA_ADMIN_OP_CREATETOPICS, TimeoutMs());
  rd_kafka_CreateTopics(rk_, topics.data(), topics.size(), opts.get(), q.get());
  rd_kafka_NewTopic_destroy_array(topics.data(), topics.size());
  absl::StatusOr<Event> ev = AwaitResult(q.get(), TimeoutMs(), "create Kafka topics");
  if (!ev.ok()) return ev.status();
  size_t n = 0;
  const rd_kafka_topic_result_t** results =
      rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev->get()), &n);
  for (size_t i = 0; i < n; ++i) {
    const rd_kafka_resp_err_t e = rd_kafka_topic_result_error(results[i]);
    const std::string name = rd_kafka_topic_result_name(results[i]);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR) continue;
    if (e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
      return ErrorStatus(e, absl::StrCat("create Kafka topic ", name));
    }
    for (const TopicSpec& s : specs) {
      if (s.name != name || s.partitions <= 0) continue;
      absl::StatusOr<std::map<std::string, int>> have = Topics(false, name);
      if (have.ok() && have->count(name) > 0 && have->at(name) < s.partitions) {
        return absl::FailedPreconditionError(
            absl::StrCat("Kafka topic ", name, " exists with ", have->at(name),
                         " partitions, fewer than the ", s.partitions, " configured"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Admin::AwaitLeaders(const std::string& topic) {
  const absl::Time deadline = absl::Now() + timeout_;
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk_, topic.c_str(), nullptr);
  absl::Status result =
      absl::UnavailableError(absl::StrCat("Kafka topic ", topic, " has no leader yet"));
  while (absl::Now() < deadline) {
    const rd_kafka_metadata_t* md = nullptr;
    if (rd_kafka_metadata(rk_, 0, rkt, &md, TimeoutMs()) != RD_KAFKA_RESP_ERR_NO_ERROR) break;
    bool ready = md->topic_cnt == 1 && md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
                 md->topics[0].partition_cnt > 0;
    for (int p = 0; ready && p < md->topics[0].partition_cnt; ++p) {
      ready = md->topics[0].partitions[p].leader >= 0;
    }
    rd_kafka_metadata_destroy(md);
    if (ready) {
      result = absl::OkStatus();
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  rd_kafka_topic_destroy(rkt);
  return result;
}

absl::Status Admin::DeleteTopics(const std::vector<std::string>& names) {
  if (names.empty()) return absl::OkStatus();
  std::vector<rd_kafka_DeleteTopic_t*> topics;
  for (const std::string& n : names) topics.push_back(rd_kafka_DeleteTopic_new(n.c_str()));
  Queue q(rd_kafka_queue_new(rk_));
  AdminOptions opts = NewOptions(rk_, RD_KAFKA_ADMIN_OP_DELETETOPICS, TimeoutMs());
  rd_kafka_DeleteTopics(rk_, topics.data(), topics.size(), opts.get(), q.get());
  rd_kafka_DeleteTopic_destroy_array(topics.data(), topics.size());
  absl::StatusOr<Event> ev = AwaitResult(q.get(), TimeoutMs(), "delete Kafka topics");
  if (!ev.ok()) return ev.status();
  size_t n = 0;
  const rd_kafka_topic_result_t** results =
      rd_kafka_DeleteTopics_result_topics(rd_kafka_event_DeleteTopics_result(ev->get()), &n);
  for (size_t i = 0; i < n; ++i) {
    const rd_kafka_resp_err_t e = rd_kafka_topic_result_error(results[i]);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR || e == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) continue;
    return ErrorStatus(e,
                       absl::StrCat("delete Kafka topic ", rd_kafka_topic_result_name(results[i])));
  }
  return absl::OkStatus();
}

absl::Status Admin::DeleteGroup(const std::string& group) {
  return Retry([&] { return DeleteGroupOnce(group); });
}

absl::Status Admin::Retry(const std::function<absl::Status()>& fn) const {
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    absl::Status st = fn();
    if (!absl::IsUnavailable(st) || absl::Now() >= deadline) return st;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status Admin::DeleteGroupOnce(const std::string& group) {
  rd_kafka_DeleteGroup_t* g = rd_kafka_DeleteGroup_new(group.c_str());
  Queue q(rd_kafka_queue_new(rk_));
  AdminOptions opts = NewOptions(rk_, RD_KAFKA_ADMIN_OP_DELETEGROUPS, TimeoutMs());
  rd_kafka_DeleteGroups(rk_, &g, 1, opts.get(), q.get());
  rd_kafka_DeleteGroup_destroy(g);
  absl::StatusOr<Event> ev = AwaitResult(q.get(), TimeoutMs(), "delete Kafka group");
  if (!ev.ok()) return ev.status();
  size_t n = 0;
  const rd_kafka_group_result_t** results =
      rd_kafka_DeleteGroups_result_groups(rd_kafka_event_DeleteGroups_result(ev->get()), &n);
  for (size_t i = 0; i < n; ++i) {
    const rd_kafka_error_t* e = rd_kafka_group_result_error(results[i]);
    if (e == nullptr) continue;
    if (rd_kafka_error_is_retriable(e)) {
      return ErrorStatus(RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, "delete Kafka group");
    }
    const rd_kafka_resp_err_t code = rd_kafka_error_code(e);
    if (code == RD_KAFKA_RESP_ERR_GROUP_ID_NOT_FOUND || code == RD_KAFKA_RESP_ERR_NON_EMPTY_GROUP) {
      continue;
    }
    return ErrorStatus(code, absl::StrCat("delete Kafka group ", group));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, int>> Admin::Topics(bool all, const std::string& topic) {
  rd_kafka_topic_t* rkt = nullptr;
  if (!all) rkt = rd_kafka_topic_new(rk_, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  const rd_kafka_resp_err_t err = rd_kafka_metadata(rk_, all ? 1 : 0, rkt, &md, TimeoutMs());
  if (rkt != nullptr) rd_kafka_topic_destroy(rkt);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) return ErrorStatus(err, "Kafka metadata");
  std::map<std::string, int> out;
  for (int i = 0; i < md->topic_cnt; ++i) {
    const rd_kafka_metadata_topic_t& t = md->topics[i];
    if (t.err != RD_KAFKA_RESP_ERR_NO_ERROR) continue;
    out[t.topic] = t.partition_cnt;
  }
  rd_kafka_metadata_destroy(md);
  if (!all && out.count(topic) == 0) {
    return absl::NotFoundError(absl::StrCat("Kafka topic ", topic, " does not exist"));
  }
  return out;
}

absl::Status Admin::Watermarks(const std::string& topic, int partition, int64_t* low,
                               int64_t* high) {
  // A topic made a moment ago may have no leader yet: asked again until the timeout.
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    const rd_kafka_resp_err_t err =
        rd_kafka_query_watermark_offsets(rk_, topic.c_str(), partition, low, high, TimeoutMs());
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return absl::OkStatus();
    const bool transient = err == RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE ||
                           err == RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION ||
                           err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
    if (!transient || absl::Now() >= deadline) {
      return ErrorStatus(err, absl::StrCat("watermarks of Kafka topic ", topic));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<std::vector<Committed>> Admin::CommittedOffsets(const std::string& group,
                                                               const std::string& topic,
                                                               int partitions) {
  absl::StatusOr<std::vector<Committed>> out;
  Retry([&] {
    out = CommittedOffsetsOnce(group, topic, partitions);
    return out.status();
  }).IgnoreError();
  return out;
}

absl::StatusOr<std::vector<Committed>> Admin::CommittedOffsetsOnce(const std::string& group,
                                                                   const std::string& topic,
                                                                   int partitions) {
  PartitionList list(rd_kafka_topic_partition_list_new(partitions));
  for (int p = 0; p < partitions; ++p)
    rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), p);
  rd_kafka_ListConsumerGroupOffsets_t* req =
      rd_kafka_ListConsumerGroupOffsets_new(group.c_str(), list.get());
  Queue q(rd_kafka_queue_new(rk_));
  AdminOptions opts = NewOptions(rk_, RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPOFFSETS, TimeoutMs());
  rd_kafka_ListConsumerGroupOffsets(rk_, &req, 1, opts.get(), q.get());
  rd_kafka_ListConsumerGroupOffsets_destroy(req);
  absl::StatusOr<Event> ev = AwaitResult(q.get(), TimeoutMs(), "Kafka group offsets");
  if (!ev.ok()) return ev.status();
  size_t n = 0;
  const rd_kafka_group_result_t** groups = rd_kafka_ListConsumerGroupOffsets_result_groups(
      rd_kafka_event_ListConsumerGroupOffsets_result(ev->get()), &n);
  std::vector<Committed> out(static_cast<size_t>(partitions));
  for (size_t i = 0; i < n; ++i) {
    if (const rd_kafka_error_t* e = rd_kafka_group_result_error(groups[i])) {
      return ErrorStatus(rd_kafka_error_code(e), absl::StrCat("offsets of Kafka group ", group));
    }
    const rd_kafka_topic_partition_list_t* parts = rd_kafka_group_result_partitions(groups[i]);
    for (int j = 0; parts != nullptr && j < parts->cnt; ++j) {
      const rd_kafka_topic_partition_t& tp = parts->elems[j];
      if (tp.partition < 0 || tp.partition >= partitions || tp.offset < 0) continue;
      Committed& c = out[static_cast<size_t>(tp.partition)];
      c.offset = tp.offset;
      if (tp.metadata != nullptr) {
        c.metadata.assign(static_cast<const char*>(tp.metadata), tp.metadata_size);
      }
    }
  }
  return out;
}

absl::Status Admin::Ping(absl::Duration timeout) {
  const rd_kafka_metadata_t* md = nullptr;
  const rd_kafka_resp_err_t err =
      rd_kafka_metadata(rk_, 0, nullptr, &md, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) return ErrorStatus(err, "Kafka metadata request");
  rd_kafka_metadata_destroy(md);
  return absl::OkStatus();
}

}  // namespace bus::kafka
