#include "drivers/rabbitmq/internal/link.h"

#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/time.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace bus::rabbitmq {
namespace {

amqp_table_entry_t BoolEntry(const char* key) {
  amqp_table_entry_t e{};
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_BOOLEAN;
  e.value.value.boolean = 1;
  return e;
}

// The TLS socket: CAs, client certificate, peer and name checks, oldest version.
absl::StatusOr<amqp_socket_t*> NewTlsSocket(amqp_connection_state_t conn, const TlsOptions& t) {
  amqp_socket_t* sock = amqp_ssl_socket_new(conn);
  if (sock == nullptr) return absl::InternalError("rabbitmq-c: cannot make a TLS socket");
  auto* ctx = static_cast<SSL_CTX*>(amqp_ssl_socket_get_context(sock));
  if (!t.ca_file.empty()) {
    if (int rc = amqp_ssl_socket_set_cacert(sock, t.ca_file.c_str()); rc != AMQP_STATUS_OK) {
      return absl::InvalidArgumentError(
          absl::StrCat("RabbitMqOptions.tls.ca_file: cannot load ", t.ca_file));
    }
  } else if (ctx != nullptr) {
    SSL_CTX_set_default_verify_paths(ctx);
  }
  if (!t.key_password.empty()) amqp_ssl_socket_set_key_passwd(sock, t.key_password.c_str());
  if (!t.cert_file.empty()) {
    if (amqp_ssl_socket_set_key(sock, t.cert_file.c_str(), t.key_file.c_str()) != AMQP_STATUS_OK) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RabbitMqOptions.tls.cert_file / key_file: cannot load ", t.cert_file, " with its key"));
    }
  }
  const bool verify = !t.insecure_skip_verify;
  amqp_ssl_socket_set_verify_peer(sock, verify ? 1 : 0);
  amqp_ssl_socket_set_verify_hostname(sock, verify && t.server_name.empty() ? 1 : 0);
  if (verify && !t.server_name.empty() && ctx != nullptr) {
    X509_VERIFY_PARAM* param = SSL_CTX_get0_param(ctx);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, t.server_name.c_str()) != 1) {
      X509_VERIFY_PARAM_set1_host(param, t.server_name.c_str(), 0);
    }
  }
  amqp_ssl_socket_set_ssl_versions(sock, AMQP_TLSv1_2, AMQP_TLSvLATEST);
  // rabbitmq-c 0.11 names no TLS 1.3 floor; OpenSSL's own call sets it.
  if (t.min_version == TlsOptions::Version::kTls13 && ctx != nullptr) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  }
  return sock;
}

}  // namespace

absl::Status LibraryStatus(int code, absl::string_view what) {
  const std::string text = absl::StrCat("RabbitMQ ", what, ": ", amqp_error_string2(code));
  switch (code) {
    case AMQP_STATUS_TIMEOUT:
      return absl::DeadlineExceededError(text);
    case AMQP_STATUS_NO_MEMORY:
    case AMQP_STATUS_BAD_AMQP_DATA:
    case AMQP_STATUS_UNKNOWN_CLASS:
    case AMQP_STATUS_UNKNOWN_METHOD:
    case AMQP_STATUS_TABLE_TOO_BIG:
    case AMQP_STATUS_INVALID_PARAMETER:
    case AMQP_STATUS_WRONG_METHOD:
      return absl::InternalError(text);
    default:
      return absl::UnavailableError(text);
  }
}

absl::Status BrokerStatus(int reply_code, absl::string_view text, absl::string_view what) {
  const std::string m = absl::StrCat("RabbitMQ ", what, ": ", text);
  switch (reply_code) {
    case AMQP_ACCESS_REFUSED:
      return absl::PermissionDeniedError(m);
    case AMQP_NOT_FOUND:
      return absl::NotFoundError(m);
    case AMQP_PRECONDITION_FAILED:
    case AMQP_RESOURCE_LOCKED:
    case AMQP_NOT_ALLOWED:
      return absl::FailedPreconditionError(m);
    case AMQP_CONTENT_TOO_LARGE:
    case AMQP_FRAME_ERROR:
      return absl::InvalidArgumentError(m);
    case AMQP_CONNECTION_FORCED:
    case AMQP_RESOURCE_ERROR:
      return absl::UnavailableError(m);
    default:
      return absl::InternalError(absl::StrCat(m, " (reply code ", reply_code, ")"));
  }
}

absl::StatusOr<std::unique_ptr<Link>> Link::Open(const RabbitMqOptions& options) {
  amqp_connection_state_t conn = amqp_new_connection();
  if (conn == nullptr) return absl::InternalError("rabbitmq-c: cannot allocate a connection");
  std::unique_ptr<Link> link(new Link(conn));
  amqp_socket_t* sock = nullptr;
  if (options.tls.enabled) {
    absl::StatusOr<amqp_socket_t*> s = NewTlsSocket(conn, options.tls);
    if (!s.ok()) return s.status();
    sock = *s;
  } else {
    sock = amqp_tcp_socket_new(conn);
    if (sock == nullptr) return absl::InternalError("rabbitmq-c: cannot make a TCP socket");
  }
  timeval connect = absl::ToTimeval(options.timeouts.connect);
  timeval request = absl::ToTimeval(options.timeouts.request);
  const std::string where = absl::StrCat(options.host, ":", options.port);
  if (int rc = amqp_socket_open_noblock(sock, options.host.c_str(), options.port, &connect);
      rc != AMQP_STATUS_OK) {
    return LibraryStatus(rc, absl::StrCat("connect to ", where));
  }
  amqp_set_handshake_timeout(conn, &connect);
  amqp_set_rpc_timeout(conn, &request);
  if (absl::Status st = link->Login(options); !st.ok()) return st;
  for (amqp_channel_t ch : {kMainChannel, kAdminChannel}) {
    if (absl::Status st = link->OpenChannel(ch); !st.ok()) return st;
  }
  return link;
}

absl::Status Link::Login(const RabbitMqOptions& o) {
  amqp_table_entry_t caps[] = {BoolEntry("consumer_cancel_notify"), BoolEntry("connection.blocked"),
                               BoolEntry("authentication_failure_close"),
                               BoolEntry("publisher_confirms")};
  amqp_table_entry_t props[2] = {};
  props[0].key = amqp_cstring_bytes("capabilities");
  props[0].value.kind = AMQP_FIELD_KIND_TABLE;
  props[0].value.value.table = amqp_table_t{4, caps};
  props[1].key = amqp_cstring_bytes("product");
  props[1].value.kind = AMQP_FIELD_KIND_UTF8;
  props[1].value.value.bytes = amqp_cstring_bytes("bus (rabbitmq-c)");
  const amqp_table_t table{2, props};
  const int heartbeat = static_cast<int>(absl::ToInt64Seconds(o.amqp.heartbeat));
  amqp_rpc_reply_t r =
      amqp_login_with_properties(conn_, o.vhost.c_str(), 0, o.amqp.frame_max, heartbeat, &table,
                                 AMQP_SASL_METHOD_PLAIN, o.user.c_str(), o.password.c_str());
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return absl::OkStatus();
  if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
      r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
    auto* close = static_cast<amqp_connection_close_t*>(r.reply.decoded);
    const std::string text = String(close->reply_text);
    if (close->reply_code == AMQP_ACCESS_REFUSED) {
      return absl::UnauthenticatedError(absl::StrCat("RabbitMQ refused the login of user '", o.user,
                                                     "' on vhost '", o.vhost, "': ", text));
    }
    return BrokerStatus(close->reply_code, text, absl::StrCat("vhost '", o.vhost, "'"));
  }
  if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
    return LibraryStatus(r.library_error, absl::StrCat("login of user '", o.user, "'"));
  }
  return absl::UnavailableError("RabbitMQ login: no reply");
}

absl::Status Link::OpenChannel(amqp_channel_t channel) {
  amqp_channel_open(conn_, channel);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn_);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    absl::Status st = r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION
                          ? LibraryStatus(r.library_error, "channel.open")
                          : absl::UnavailableError("RabbitMQ refused channel.open");
    Break(st);
    return st;
  }
  if (channel == kMainChannel && confirms_) {
    amqp_confirm_select(conn_, channel);
    r = amqp_get_rpc_reply(conn_);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      absl::Status st = absl::UnavailableError("RabbitMQ refused confirm.select");
      Break(st);
      return st;
    }
  }
  return absl::OkStatus();
}

absl::Status Link::ClosePeekChannel() {
  amqp_rpc_reply_t r = amqp_channel_close(conn_, kPeekChannel, AMQP_REPLY_SUCCESS);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return absl::OkStatus();
  // The broker closed it first (a peek into a missing queue): acknowledged by Check already.
  return broken() ? broken_ : absl::OkStatus();
}

absl::Status Link::SelectConfirms() {
  confirms_ = true;
  amqp_confirm_select(conn_, kMainChannel);
  return Check(kMainChannel, "confirm.select");
}

absl::Status Link::OnChannelClose(amqp_channel_t channel, const amqp_channel_close_t& close) {
  absl::Status st = BrokerStatus(close.reply_code, String(close.reply_text), "channel closed");
  return Reopen(channel, st);
}

absl::Status Link::Reopen(amqp_channel_t channel, absl::Status why) {
  amqp_channel_close_ok_t ok{};
  if (int rc = amqp_send_method(conn_, channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
      rc != AMQP_STATUS_OK) {
    Break(LibraryStatus(rc, "channel.close-ok"));
    return broken_;
  }
  if (absl::Status open = OpenChannel(channel); !open.ok()) return open;
  return why;
}

absl::Status Link::Check(amqp_channel_t channel, absl::string_view what) {
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn_);
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return absl::OkStatus();
    case AMQP_RESPONSE_LIBRARY_EXCEPTION: {
      absl::Status st = LibraryStatus(r.library_error, what);
      Break(st);
      return st;
    }
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        auto* close = static_cast<amqp_channel_close_t*>(r.reply.decoded);
        return Reopen(channel, BrokerStatus(close->reply_code, String(close->reply_text), what));
      }
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        auto* close = static_cast<amqp_connection_close_t*>(r.reply.decoded);
        amqp_connection_close_ok_t ok{};
        amqp_send_method(conn_, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
        Break(absl::UnavailableError(
            absl::StrCat("RabbitMQ closed the connection: ", String(close->reply_text))));
        return broken_;
      }
      Break(absl::InternalError(absl::StrCat("RabbitMQ ", what, ": unexpected reply")));
      return broken_;
    default:
      Break(absl::UnavailableError(absl::StrCat("RabbitMQ ", what, ": no reply")));
      return broken_;
  }
}

void Link::Break(absl::Status why) {
  if (broken_.ok()) broken_ = std::move(why);
}

Link::~Link() {
  if (!broken()) amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn_);
}

}  // namespace bus::rabbitmq
