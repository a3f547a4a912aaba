#include "drivers/kafka/internal/client.h"

#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace bus::kafka {
namespace {

std::string Ms(absl::Duration d) { return absl::StrCat(absl::ToInt64Milliseconds(d)); }

std::vector<std::pair<std::string, std::string>> SecurityProperties(const KafkaOptions& o) {
  std::vector<std::pair<std::string, std::string>> p;
  const bool sasl = !o.sasl.mechanism.empty();
  p.emplace_back("security.protocol", sasl ? (o.tls.enabled ? "sasl_ssl" : "sasl_plaintext")
                                           : (o.tls.enabled ? "ssl" : "plaintext"));
  if (o.tls.enabled) {
    if (!o.tls.ca_file.empty()) p.emplace_back("ssl.ca.location", o.tls.ca_file);
    if (!o.tls.cert_file.empty()) p.emplace_back("ssl.certificate.location", o.tls.cert_file);
    if (!o.tls.key_file.empty()) p.emplace_back("ssl.key.location", o.tls.key_file);
    if (!o.tls.key_password.empty()) p.emplace_back("ssl.key.password", o.tls.key_password);
    if (o.tls.insecure_skip_verify) {
      p.emplace_back("enable.ssl.certificate.verification", "false");
      p.emplace_back("ssl.endpoint.identification.algorithm", "none");
    }
  }
  if (sasl) {
    p.emplace_back("sasl.mechanisms", o.sasl.mechanism);
    p.emplace_back("sasl.username", o.sasl.username);
    p.emplace_back("sasl.password", o.sasl.password);
  }
  return p;
}

// librdkafka's own log lines go nowhere: its errors reach the driver as statuses.
void DropLog(const rd_kafka_t*, int, const char*, const char*) {}

struct Batch {
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;
  rd_kafka_resp_err_t err ABSL_GUARDED_BY(mu) = RD_KAFKA_RESP_ERR_NO_ERROR;
};

void OnDelivery(rd_kafka_t*, const rd_kafka_message_t* m, void*) {
  auto* ref = static_cast<std::shared_ptr<Batch>*>(m->_private);
  {
    absl::MutexLock lock(&(*ref)->mu);
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR && (*ref)->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      (*ref)->err = m->err;
    }
    --(*ref)->pending;
  }
  delete ref;
}

rd_kafka_headers_t* Headers(const OutRecord& r) {
  rd_kafka_headers_t* h = rd_kafka_headers_new(3);
  if (r.attempts > 0) {
    const std::string v = absl::StrCat(r.attempts);
    rd_kafka_header_add(h, kAttemptsHeader, -1, v.data(), static_cast<ssize_t>(v.size()));
  }
  if (r.due_ms > 0) {
    const std::string v = absl::StrCat(r.due_ms);
    rd_kafka_header_add(h, kDueHeader, -1, v.data(), static_cast<ssize_t>(v.size()));
  }
  if (r.topic_send) {
    rd_kafka_header_add(h, kRouteKeyHeader, -1, r.route_key.data(),
                        static_cast<ssize_t>(r.route_key.size()));
  }
  return h;
}

}  // namespace

absl::StatusOr<Conf> NewConf(const KafkaOptions& o,
                             const std::vector<std::pair<std::string, std::string>>& extra) {
  Conf conf(rd_kafka_conf_new());
  std::vector<std::pair<std::string, std::string>> props = {
      {"bootstrap.servers", absl::StrJoin(o.brokers, ",")},
      {"client.id", o.client_id},
      {"socket.connection.setup.timeout.ms", Ms(o.timeouts.connect)},
      {"reconnect.backoff.ms", Ms(o.backoff.initial)},
      {"reconnect.backoff.max.ms", Ms(o.backoff.max)},
  };
  for (auto& p : SecurityProperties(o)) props.push_back(std::move(p));
  for (const auto& p : extra) props.push_back(p);
  char err[512];
  for (const auto& [name, value] : props) {
    if (rd_kafka_conf_set(conf.get(), name.c_str(), value.c_str(), err, sizeof(err)) !=
        RD_KAFKA_CONF_OK) {
      return absl::InvalidArgumentError(
          absl::StrCat("librdkafka refused the property ", name, " (from KafkaOptions)"));
    }
  }
  rd_kafka_conf_set_log_cb(conf.get(), DropLog);
  return conf;
}

absl::StatusOr<Handle> NewClient(Conf conf, rd_kafka_type_t type) {
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(type, conf.get(), err, sizeof(err));
  if (rk == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a Kafka client: ", err));
  }
  conf.release();  // owned by rk now
  return Handle(rk);
}

absl::Status ErrorStatus(rd_kafka_resp_err_t err, absl::string_view what) {
  const std::string text = absl::StrCat(what, ": ", rd_kafka_err2str(err));
  switch (err) {
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
    case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
      return absl::UnavailableError(text);
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
      return absl::NotFoundError(text);
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
      return absl::PermissionDeniedError(text);
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
      return absl::UnauthenticatedError(text);
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
      return absl::InvalidArgumentError(text);
    default:
      return absl::InternalError(text);
  }
}

bool FindHeader(const rd_kafka_message_t* m, const char* name, std::string* value) {
  rd_kafka_headers_t* h = nullptr;
  if (rd_kafka_message_headers(m, &h) != RD_KAFKA_RESP_ERR_NO_ERROR) return false;
  const void* v = nullptr;
  size_t size = 0;
  if (rd_kafka_header_get_last(h, name, &v, &size) != RD_KAFKA_RESP_ERR_NO_ERROR) return false;
  value->assign(static_cast<const char*>(v), v == nullptr ? 0 : size);
  return true;
}

absl::StatusOr<std::unique_ptr<Producer>> Producer::Start(const KafkaOptions& o) {
  const bool all = o.producer.acks == "all";
  absl::StatusOr<Conf> conf =
      NewConf(o, {{"acks", all ? "-1" : o.producer.acks},
                  {"enable.idempotence", all ? "true" : "false"},
                  {"linger.ms", Ms(o.producer.linger)},
                  {"message.max.bytes", absl::StrCat(o.producer.max_message_bytes + 4096)},
                  {"message.timeout.ms", Ms(o.timeouts.request)}});
  if (!conf.ok()) return conf.status();
  rd_kafka_conf_set_dr_msg_cb(conf->get(), OnDelivery);
  absl::StatusOr<Handle> rk = NewClient(std::move(*conf), RD_KAFKA_PRODUCER);
  if (!rk.ok()) return rk.status();
  std::unique_ptr<Producer> p(new Producer(std::move(*rk), o.timeouts.request));
  p->poller_ = std::thread([raw = p.get()] { raw->PollLoop(); });
  return p;
}

Producer::~Producer() {
  rd_kafka_flush(rk_.get(), static_cast<int>(absl::ToInt64Milliseconds(timeout_)));
  stop_.store(true);
  poller_.join();
}

void Producer::PollLoop() {
  while (!stop_.load()) rd_kafka_poll(rk_.get(), 50);
}

absl::Status Producer::Send(absl::Span<const OutRecord> records) {
  auto batch = std::make_shared<Batch>();
  for (const OutRecord& r : records) {
    {
      absl::MutexLock lock(&batch->mu);
      ++batch->pending;
    }
    auto* ref = new std::shared_ptr<Batch>(batch);
    rd_kafka_headers_t* headers = Headers(r);
    rd_kafka_resp_err_t err;
    for (;;) {
      err = rd_kafka_producev(
          rk_.get(), RD_KAFKA_V_TOPIC(r.topic.c_str()),
          RD_KAFKA_V_KEY(r.key.empty() ? nullptr : const_cast<char*>(r.key.data()), r.key.size()),
          RD_KAFKA_V_VALUE(r.tombstone ? nullptr : const_cast<char*>(r.value.data()),
                           r.tombstone ? 0 : r.value.size()),
          RD_KAFKA_V_HEADERS(headers), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
          RD_KAFKA_V_OPAQUE(ref), RD_KAFKA_V_END);
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) break;
      rd_kafka_poll(rk_.get(), 10);
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      rd_kafka_headers_destroy(headers);
      delete ref;
      absl::MutexLock lock(&batch->mu);
      --batch->pending;
      if (batch->err == RD_KAFKA_RESP_ERR_NO_ERROR) batch->err = err;
      break;
    }
  }
  absl::MutexLock lock(&batch->mu);
  auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(batch->mu) { return batch->pending == 0; };
  if (!batch->mu.AwaitWithTimeout(absl::Condition(&done), timeout_ + absl::Seconds(5))) {
    return absl::UnavailableError("a send to Kafka was not acknowledged in time");
  }
  if (batch->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return ErrorStatus(batch->err, absl::StrCat("send to Kafka topic ", records[0].topic));
  }
  return absl::OkStatus();
}

}  // namespace bus::kafka
