#include "drivers/nats/internal/client.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bus/backoff.h"

namespace bus::nats {
namespace {

struct OptionsDeleter {
  void operator()(natsOptions* o) const { natsOptions_Destroy(o); }
};

// Room a header takes on the wire ("name: value\r\n"), plus the "NATS/1.0\r\n\r\n" frame.
size_t HeaderBytes(const std::vector<std::pair<std::string, std::string>>& headers) {
  size_t n = headers.empty() ? 0 : 12;
  for (const auto& [k, v] : headers) n += k.size() + v.size() + 4;
  return n;
}

absl::StatusOr<MsgPtr> NewMsg(const std::string& subject, const std::string& reply,
                              absl::string_view data,
                              const std::vector<std::pair<std::string, std::string>>& headers) {
  natsMsg* raw = nullptr;
  natsStatus s = natsMsg_Create(&raw, subject.c_str(), reply.empty() ? nullptr : reply.c_str(),
                                data.data(), static_cast<int>(data.size()));
  if (s != NATS_OK) return FromNats(s, "natsMsg_Create");
  MsgPtr msg(raw);
  for (const auto& [k, v] : headers) {
    if ((s = natsMsgHeader_Set(msg.get(), k.c_str(), v.c_str())) != NATS_OK) {
      return FromNats(s, "natsMsgHeader_Set");
    }
  }
  return msg;
}

// A publish acknowledgement ({"stream", "seq"} or {"error"}).
absl::Status ReadPubAck(natsMsg* reply, absl::string_view subject) {
  if (StatusCode(reply) == 503) {
    return absl::FailedPreconditionError(
        absl::StrCat("no JetStream stream owns ", subject, " (was the stream deleted?)"));
  }
  nlohmann::json ack = nlohmann::json::parse(
      absl::string_view(natsMsg_GetData(reply), natsMsg_GetDataLength(reply)), nullptr, false);
  if (ack.is_discarded() || !ack.is_object()) {
    return absl::InternalError(absl::StrCat("unreadable publish acknowledgement for ", subject));
  }
  if (ack.contains("error")) return FromApiError(ack["error"], absl::StrCat("publish ", subject));
  return absl::OkStatus();
}

}  // namespace

int64_t Millis(absl::Duration d) { return std::max<int64_t>(1, absl::ToInt64Milliseconds(d)); }

absl::Status FromNats(natsStatus s, absl::string_view what) {
  const std::string text = absl::StrCat(what, ": ", natsStatus_GetText(s));
  switch (s) {
    case NATS_OK:
      return absl::OkStatus();
    case NATS_CONNECTION_AUTH_FAILED:
      return absl::UnauthenticatedError(text);
    case NATS_NOT_PERMITTED:
      return absl::PermissionDeniedError(text);
    case NATS_MAX_PAYLOAD:
    case NATS_INVALID_SUBJECT:
    case NATS_INVALID_ARG:
      return absl::InvalidArgumentError(text);
    case NATS_NO_RESPONDERS:
      return absl::FailedPreconditionError(text);
    case NATS_SSL_ERROR:
      return absl::UnavailableError(absl::StrCat(text, " (TLS handshake or certificate)"));
    default:
      return absl::UnavailableError(text);
  }
}

absl::Status FromApiError(const nlohmann::json& error, absl::string_view what) {
  const int code = error.value("code", 0);
  const int err_code = error.value("err_code", 0);
  const std::string text =
      absl::StrCat(what, ": ", error.value("description", std::string("JetStream error")),
                   " (err_code ", err_code, ")");
  if (err_code == 10039 || err_code == 10076) {
    return absl::FailedPreconditionError(absl::StrCat(text, ": JetStream is not enabled"));
  }
  switch (code) {
    case 400:
      return absl::InvalidArgumentError(text);
    case 401:
    case 403:
      return absl::PermissionDeniedError(text);
    case 404:
      return absl::NotFoundError(text);
    case 408:
    case 503:
      return absl::UnavailableError(text);
    default:
      return absl::InternalError(text);
  }
}

int StatusCode(natsMsg* msg) {
  const char* value = nullptr;
  if (natsMsgHeader_Get(msg, "Status", &value) != NATS_OK || value == nullptr) return 0;
  int code = 0;
  return absl::SimpleAtoi(value, &code) ? code : 0;
}

std::string StatusDescription(natsMsg* msg) {
  const char* value = nullptr;
  if (natsMsgHeader_Get(msg, "Description", &value) != NATS_OK || value == nullptr) return "";
  return value;
}

std::string Client::NewInbox() {
  natsInbox* inbox = nullptr;
  if (natsInbox_Create(&inbox) != NATS_OK) return absl::StrCat("_INBOX.bus", rand());
  std::string out(inbox);
  natsInbox_Destroy(inbox);
  return out;
}

void Client::OnReconnected(natsConnection*, void* closure) {
  static_cast<Client*>(closure)->reconnects_.fetch_add(1);
}

int64_t Client::ReconnectDelay(natsConnection*, int attempts, void* closure) {
  const Client* c = static_cast<Client*>(closure);
  std::shared_ptr<RandomSource> random = c->options_.random ? c->options_.random : DefaultRandom();
  return absl::ToInt64Milliseconds(
      BackoffDelay(c->options_.backoff, std::max(1, attempts), *random));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const NatsOptions& options) {
  std::unique_ptr<Client> c(new Client(options));
  natsOptions* raw = nullptr;
  if (natsStatus s = natsOptions_Create(&raw); s != NATS_OK) return FromNats(s, "NATS options");
  std::unique_ptr<natsOptions, OptionsDeleter> opts(raw);
  std::vector<const char*> servers;
  bool tls = options.tls.enabled;
  for (const std::string& s : options.servers) {
    servers.push_back(s.c_str());
    tls = tls || absl::StartsWith(s, "tls://");
  }
  natsStatus s =
      natsOptions_SetServers(opts.get(), servers.data(), static_cast<int>(servers.size()));
  if (s == NATS_OK) s = natsOptions_SetTimeout(opts.get(), Millis(options.timeouts.connect));
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts.get(), -1);
  if (s == NATS_OK) s = natsOptions_SetCustomReconnectDelay(opts.get(), &ReconnectDelay, c.get());
  if (s == NATS_OK) s = natsOptions_SetReconnectedCB(opts.get(), &OnReconnected, c.get());
  if (s == NATS_OK && !options.username.empty()) {
    s = natsOptions_SetUserInfo(opts.get(), options.username.c_str(), options.password.c_str());
  }
  if (s == NATS_OK && !options.token.empty())
    s = natsOptions_SetToken(opts.get(), options.token.c_str());
  if (s == NATS_OK && !options.credentials_file.empty()) {
    s = natsOptions_SetUserCredentialsFromFiles(opts.get(), options.credentials_file.c_str(),
                                                nullptr);
  }
  if (s == NATS_OK && !options.nkey_seed_file.empty()) {
    s = natsOptions_SetNKeyFromSeed(opts.get(), options.nkey_public.c_str(),
                                    options.nkey_seed_file.c_str());
  }
  if (s == NATS_OK && tls) s = natsOptions_SetSecure(opts.get(), true);
  if (s == NATS_OK && tls && !options.tls.ca_file.empty()) {
    s = natsOptions_LoadCATrustedCertificates(opts.get(), options.tls.ca_file.c_str());
  }
  if (s == NATS_OK && tls && !options.tls.cert_file.empty()) {
    s = natsOptions_LoadCertificatesChain(opts.get(), options.tls.cert_file.c_str(),
                                          options.tls.key_file.c_str());
  }
  if (s == NATS_OK && tls && !options.tls.server_name.empty()) {
    s = natsOptions_SetExpectedHostname(opts.get(), options.tls.server_name.c_str());
  }
  if (s == NATS_OK && tls && options.tls.insecure_skip_verify) {
    s = natsOptions_SkipServerVerification(opts.get(), true);
  }
  if (s != NATS_OK) return FromNats(s, "NATS options (TLS files or credentials)");
  s = natsConnection_Connect(&c->conn_, opts.get());
  if (s != NATS_OK) {
    const std::string source =
        options.credentials_source.empty() ? "NatsOptions" : options.credentials_source;
    absl::Status st = FromNats(s, "connect to NATS");
    if (absl::IsUnauthenticated(st) || absl::IsPermissionDenied(st)) {
      return absl::UnauthenticatedError(
          absl::StrCat("NATS refused the credentials from ", source, ": ", st.message()));
    }
    return st;
  }
  return c;
}

Client::~Client() {
  if (conn_ != nullptr) {
    natsConnection_Close(conn_);
    natsConnection_Destroy(conn_);
  }
}

absl::StatusOr<nlohmann::json> Client::Api(absl::string_view api, const nlohmann::json& body,
                                           absl::Duration timeout) {
  if (timeout == absl::ZeroDuration()) timeout = options_.timeouts.request;
  const std::string subject = absl::StrCat("$JS.API.", api);
  const std::string payload = body.is_null() ? std::string() : body.dump();
  natsMsg* raw = nullptr;
  natsStatus s = natsConnection_Request(&raw, conn_, subject.c_str(), payload.data(),
                                        static_cast<int>(payload.size()), Millis(timeout));
  if (s == NATS_NO_RESPONDERS) {
    return absl::FailedPreconditionError(
        "JetStream is not enabled on the NATS server (start nats-server with -js, or enable "
        "JetStream for this account)");
  }
  if (s != NATS_OK) return FromNats(s, absl::StrCat("JetStream API ", api));
  MsgPtr reply(raw);
  nlohmann::json j = nlohmann::json::parse(
      absl::string_view(natsMsg_GetData(raw), natsMsg_GetDataLength(raw)), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError(absl::StrCat("unreadable JetStream reply to ", api));
  }
  if (j.contains("error")) return FromApiError(j["error"], absl::StrCat("JetStream API ", api));
  return j;
}

absl::Status Client::CheckSize(absl::string_view subject, size_t data_bytes,
                               size_t header_bytes) const {
  const int64_t max = natsConnection_GetMaxPayload(conn_);
  if (max > 0 && static_cast<int64_t>(data_bytes + header_bytes) > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("message of ", data_bytes, " bytes (", header_bytes, " of headers) for ",
                     subject, " exceeds the NATS server's max_payload of ", max, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status Client::Publish(const std::string& subject, absl::string_view data,
                             const std::vector<std::pair<std::string, std::string>>& headers) {
  if (absl::Status st = CheckSize(subject, data.size(), HeaderBytes(headers)); !st.ok()) return st;
  absl::StatusOr<MsgPtr> msg = NewMsg(subject, "", data, headers);
  if (!msg.ok()) return msg.status();
  // Retried within timeouts.request: the Nats-Msg-Id header makes a repeat a duplicate the
  // stream drops.
  const absl::Time deadline = absl::Now() + options_.timeouts.request;
  Backoff backoff(options_.backoff, options_.random);
  for (;;) {
    natsMsg* reply = nullptr;
    natsStatus s =
        natsConnection_RequestMsg(&reply, conn_, msg->get(), Millis(deadline - absl::Now()));
    if (s == NATS_OK) {
      MsgPtr owned(reply);
      return ReadPubAck(reply, subject);
    }
    absl::Status st = s == NATS_NO_RESPONDERS
                          ? absl::FailedPreconditionError(absl::StrCat(
                                "no JetStream stream owns ", subject, " (was the stream deleted?)"))
                          : FromNats(s, absl::StrCat("publish to ", subject));
    const absl::Duration wait = backoff.Next();
    if (!absl::IsUnavailable(st) || absl::Now() + wait >= deadline) return st;
    absl::SleepFor(wait);
  }
}

absl::Status Client::PublishMany(const std::vector<Outgoing>& messages) {
  for (const Outgoing& m : messages) {
    absl::Status st = CheckSize(m.subject, m.data.size(), HeaderBytes(m.headers));
    if (!st.ok()) return st;
  }
  const std::string inbox = NewInbox();
  natsSubscription* raw = nullptr;
  natsStatus s = natsConnection_SubscribeSync(&raw, conn_, absl::StrCat(inbox, ".*").c_str());
  if (s != NATS_OK) return FromNats(s, "subscribe for publish acknowledgements");
  SubPtr sub(raw);
  natsSubscription_SetPendingLimits(raw, -1, -1);
  for (size_t i = 0; i < messages.size(); ++i) {
    const Outgoing& m = messages[i];
    absl::StatusOr<MsgPtr> msg = NewMsg(m.subject, absl::StrCat(inbox, ".", i), m.data, m.headers);
    if (!msg.ok()) return msg.status();
    if ((s = natsConnection_PublishMsg(conn_, msg->get())) != NATS_OK) {
      return FromNats(s, absl::StrCat("publish to ", m.subject));
    }
  }
  absl::Status first = absl::OkStatus();
  const absl::Time deadline = absl::Now() + options_.timeouts.request;
  for (size_t got = 0; got < messages.size(); ++got) {
    natsMsg* reply = nullptr;
    s = natsSubscription_NextMsg(&reply, raw, Millis(deadline - absl::Now()));
    if (s != NATS_OK) return FromNats(s, "publish acknowledgements");
    MsgPtr owned(reply);
    if (absl::Status st = ReadPubAck(reply, messages[0].subject); first.ok()) first = st;
  }
  return first;
}

}  // namespace bus::nats
