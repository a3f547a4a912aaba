#include "common/postgres/internal/connection.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace bus::pg_internal {
namespace {

// PostgreSQL's binary timestamps count microseconds from 2000-01-01 00:00 UTC.
constexpr int64_t kPostgresEpochUnixMicros = 946684800000000;

// A big-endian integer of `n` bytes (the binary format's byte order).
uint64_t LoadBigEndian(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string Trimmed(const char* text) {
  return std::string(absl::StripAsciiWhitespace(text != nullptr ? text : ""));
}

}  // namespace

Param Param::Time(absl::Time t) {
  return Text(absl::FormatTime("%Y-%m-%d %H:%M:%E6S+00", t, absl::UTCTimeZone()));
}

int64_t Result::affected() const {
  int64_t n = 0;
  return absl::SimpleAtoi(PQcmdTuples(res_.get()), &n) ? n : 0;
}

absl::string_view Result::Bytes(int row, int col) const {
  return absl::string_view(PQgetvalue(res_.get(), row, col),
                           static_cast<size_t>(PQgetlength(res_.get(), row, col)));
}

int64_t Result::Int(int row, int col) const {
  const char* p = PQgetvalue(res_.get(), row, col);
  switch (PQgetlength(res_.get(), row, col)) {
    case 2:
      return static_cast<int16_t>(LoadBigEndian(p, 2));
    case 4:
      return static_cast<int32_t>(LoadBigEndian(p, 4));
    case 8:
      return static_cast<int64_t>(LoadBigEndian(p, 8));
    default:
      return 0;
  }
}

bool Result::Bool(int row, int col) const {
  return PQgetlength(res_.get(), row, col) == 1 && PQgetvalue(res_.get(), row, col)[0] != 0;
}

double Result::Float(int row, int col) const {
  if (PQgetlength(res_.get(), row, col) != 8) return 0;
  const uint64_t bits = LoadBigEndian(PQgetvalue(res_.get(), row, col), 8);
  double v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

absl::Time Result::Time(int row, int col) const {
  return absl::FromUnixMicros(Int(row, col) + kPostgresEpochUnixMicros);
}

absl::Status PgStatus(const PGresult* res, PGconn* conn, absl::string_view context,
                      absl::string_view redacted) {
  const char* state = res != nullptr ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  std::string message;
  if (res != nullptr && PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) != nullptr) {
    message = Trimmed(PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY));
  } else {
    message = Trimmed(conn != nullptr ? PQerrorMessage(conn) : "no connection");
  }
  const std::string code = state != nullptr ? state : "";
  const std::string text =
      absl::StrCat(context, ": ", message,
                   code.empty() ? "" : absl::StrCat(" (SQLSTATE ", code, ")"), " [", redacted, "]");
  if (code.empty() || absl::StartsWith(code, "08") || absl::StartsWith(code, "53") ||
      code == "57P01" || code == "57P02" || code == "57P03") {
    return absl::UnavailableError(text);
  }
  if (absl::StartsWith(code, "28")) return absl::UnauthenticatedError(text);
  if (code == "42501") return absl::PermissionDeniedError(text);
  if (code == "40001" || code == "40P01") return absl::AbortedError(text);
  if (code == "57014") return absl::DeadlineExceededError(text);
  if (code == "55000") return absl::FailedPreconditionError(text);
  if (absl::StartsWith(code, "22")) return absl::InvalidArgumentError(text);
  if (code == "23505") return absl::AlreadyExistsError(text);
  if (absl::StartsWith(code, "23")) return absl::FailedPreconditionError(text);
  if (code == "3D000" || code == "3F000") return absl::NotFoundError(text);
  return absl::InternalError(text);
}

absl::Status ConnectStatus(PGconn* conn, absl::string_view redacted) {
  const std::string message = Trimmed(conn != nullptr ? PQerrorMessage(conn) : "out of memory");
  const std::string text = absl::StrCat("PostgreSQL connect: ", message, " [", redacted, "]");
  if (conn != nullptr && PQconnectionNeedsPassword(conn)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "PostgreSQL connect: the server wants a password and none was given (in the URL, "
        "PGPASSWORD or a passfile) [",
        redacted, "]"));
  }
  if (absl::StrContains(message, "authentication failed") ||
      absl::StrContains(message, "no pg_hba.conf entry")) {
    return absl::UnauthenticatedError(text);
  }
  if (absl::StrContains(message, "database \"") && absl::StrContains(message, "does not exist")) {
    return absl::NotFoundError(text);
  }
  return absl::UnavailableError(text);
}

std::string QuoteIdentifier(absl::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const ConnectSpec& spec) {
  std::vector<std::string> keys;
  std::vector<std::string> values;
  bool have_timeout = false;
  std::string session_options =
      absl::StrCat("-c statement_timeout=", absl::ToInt64Milliseconds(spec.statement_timeout));
  for (const auto& [k, v] : spec.params) {
    if (k == "options") {
      // The user's own session options first; the library's statement timeout after them wins.
      session_options = absl::StrCat(v, " ", session_options);
      continue;
    }
    if (k == "connect_timeout") have_timeout = true;
    keys.push_back(k);
    values.push_back(v);
  }
  if (!have_timeout) {
    keys.push_back("connect_timeout");
    // libpq counts whole seconds and takes 1 as 2.
    values.push_back(
        absl::StrCat(std::max<int64_t>(2, absl::ToInt64Seconds(spec.connect_timeout))));
  }
  keys.push_back("options");
  values.push_back(session_options);
  keys.push_back("fallback_application_name");
  values.push_back("msgbus");
  std::vector<const char*> k;
  std::vector<const char*> v;
  for (size_t i = 0; i < keys.size(); ++i) {
    k.push_back(keys[i].c_str());
    v.push_back(values[i].c_str());
  }
  k.push_back(nullptr);
  v.push_back(nullptr);
  PGconn* raw = PQconnectdbParams(k.data(), v.data(), /*expand_dbname=*/0);
  if (raw == nullptr || PQstatus(raw) != CONNECTION_OK) {
    absl::Status st = ConnectStatus(raw, spec.redacted);
    PQfinish(raw);
    return st;
  }
  std::unique_ptr<Connection> conn(new Connection(raw, spec.redacted));
  if (PQsetnonblocking(raw, 1) != 0) {
    return absl::InternalError(
        absl::StrCat("PostgreSQL: cannot switch to non-blocking mode [", spec.redacted, "]"));
  }
  return conn;
}

absl::Status Connection::Abandon(absl::Status why) {
  broken_ = true;
  return why;
}

absl::Status Connection::Wait(bool write, absl::Time deadline) {
  pollfd pfd{};
  pfd.fd = PQsocket(conn_.get());
  pfd.events = static_cast<short>(POLLIN | (write ? POLLOUT : 0));
  // Real time: the wait is for the server's answer over the network.
  const absl::Duration left = deadline - absl::Now();
  const int ms =
      left <= absl::ZeroDuration() ? 0 : static_cast<int>(absl::ToInt64Milliseconds(left) + 1);
  const int n = poll(&pfd, 1, ms);
  if (n == 0) {
    // Ask the server to stop the request; the connection is given up either way.
    char buf[256];
    if (PGcancel* cancel = PQgetCancel(conn_.get()); cancel != nullptr) {
      PQcancel(cancel, buf, sizeof(buf));
      PQfreeCancel(cancel);
    }
    return Abandon(absl::DeadlineExceededError(
        absl::StrCat("PostgreSQL: no answer before the deadline [", redacted_, "]")));
  }
  if (n < 0 && errno != EINTR) {
    return Abandon(absl::UnavailableError(
        absl::StrCat("PostgreSQL: poll: ", std::strerror(errno), " [", redacted_, "]")));
  }
  if ((pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0 && PQconsumeInput(conn_.get()) == 0) {
    return Abandon(PgStatus(nullptr, conn_.get(), "PostgreSQL", redacted_));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Connection::AwaitNotification(absl::Time deadline, int wake_fd) {
  const auto drain = [this] {
    bool any = false;
    while (PGnotify* n = PQnotifies(conn_.get())) {
      any = true;
      PQfreemem(n);
    }
    return any;
  };
  while (true) {
    if (drain()) return true;
    pollfd fds[2] = {};
    fds[0].fd = PQsocket(conn_.get());
    fds[0].events = POLLIN;
    fds[1].fd = wake_fd;
    fds[1].events = POLLIN;
    // Real time: the wait for the server's notification over the network.
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int n = poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(left) + 1));
    if (n < 0 && errno != EINTR) {
      return Abandon(absl::UnavailableError(
          absl::StrCat("PostgreSQL: poll: ", std::strerror(errno), " [", redacted_, "]")));
    }
    if (n <= 0) continue;
    if ((fds[1].revents & POLLIN) != 0) return false;
    if (PQconsumeInput(conn_.get()) == 0 || PQstatus(conn_.get()) != CONNECTION_OK) {
      return Abandon(PgStatus(nullptr, conn_.get(), "PostgreSQL: LISTEN", redacted_));
    }
  }
}

bool Connection::Stale() {
  if (broken()) return true;
  pollfd pfd{};
  pfd.fd = PQsocket(conn_.get());
  pfd.events = POLLIN;
  return poll(&pfd, 1, 0) != 0;
}

absl::Status Connection::SendStatements(absl::Span<const Statement> statements,
                                        std::vector<std::string>& preparing) {
  PGconn* c = conn_.get();
  // A text that comes twice is prepared once.
  absl::flat_hash_map<std::string, std::string> pending;
  for (size_t i = 0; i < statements.size(); ++i) {
    const Statement& s = statements[i];
    std::vector<const char*> values;
    std::vector<int> lengths;
    std::vector<int> formats;
    for (const Param& p : s.params) {
      values.push_back(p.value.has_value() ? p.value->data() : nullptr);
      lengths.push_back(p.value.has_value() ? static_cast<int>(p.value->size()) : 0);
      formats.push_back(p.binary ? 1 : 0);
    }
    const int n = static_cast<int>(s.params.size());
    const int result_format = s.text_results ? 0 : 1;
    int sent = 0;
    if (!s.prepare) {
      sent = PQsendQueryParams(c, s.sql->c_str(), n, nullptr, values.data(), lengths.data(),
                               formats.data(), result_format);
    } else {
      std::string name;
      if (auto it = prepared_.find(*s.sql); it != prepared_.end()) {
        name = it->second;
      } else if (auto p = pending.find(*s.sql); p != pending.end()) {
        name = p->second;
      } else {
        name = absl::StrCat("bus_", next_name_++);
        if (PQsendPrepare(c, name.c_str(), s.sql->c_str(), n, nullptr) != 1) {
          return Abandon(PgStatus(nullptr, c, "PostgreSQL: send", redacted_));
        }
        pending.emplace(*s.sql, name);
        preparing[i] = name;
      }
      sent = PQsendQueryPrepared(c, name.c_str(), n, values.data(), lengths.data(), formats.data(),
                                 result_format);
    }
    if (sent != 1) return Abandon(PgStatus(nullptr, c, "PostgreSQL: send", redacted_));
  }
  return absl::OkStatus();
}

absl::Status Connection::FlushPipeline(absl::Time deadline) {
  PGconn* c = conn_.get();
  if (PQpipelineSync(c) != 1) return Abandon(PgStatus(nullptr, c, "PostgreSQL: sync", redacted_));
  while (true) {
    const int f = PQflush(c);
    if (f == 0) return absl::OkStatus();
    if (f < 0) return Abandon(PgStatus(nullptr, c, "PostgreSQL: send", redacted_));
    if (absl::Status st = Wait(/*write=*/true, deadline); !st.ok()) return st;
  }
}

absl::StatusOr<PGresult*> Connection::NextResult(absl::Time deadline) {
  while (PQisBusy(conn_.get())) {
    if (absl::Status st = Wait(/*write=*/false, deadline); !st.ok()) return st;
  }
  return PQgetResult(conn_.get());
}

absl::StatusOr<std::optional<Result>> Connection::ReadOne(size_t i, bool rows, absl::Time deadline,
                                                          PipelineError& error) {
  PGconn* c = conn_.get();
  absl::StatusOr<PGresult*> r = NextResult(deadline);
  if (!r.ok()) return r.status();
  if (*r == nullptr) return Abandon(PgStatus(nullptr, c, "PostgreSQL: result missing", redacted_));
  Result owned(*r);
  std::optional<Result> out;
  const ExecStatusType st = PQresultStatus(*r);
  if (st == PGRES_COMMAND_OK || (rows && st == PGRES_TUPLES_OK)) {
    out.emplace(std::move(owned));
  } else if (st != PGRES_PIPELINE_ABORTED && error.status.ok()) {
    error = {PgStatus(*r, c, "PostgreSQL", redacted_), i};
  }
  absl::StatusOr<PGresult*> end = NextResult(deadline);
  if (!end.ok()) return end.status();
  if (*end != nullptr) {
    PQclear(*end);
    return Abandon(absl::InternalError(
        absl::StrCat("PostgreSQL: more than one result for a statement [", redacted_, "]")));
  }
  return out;
}

absl::Status Connection::EndPipeline(absl::Time deadline) {
  absl::StatusOr<PGresult*> sync = NextResult(deadline);
  if (!sync.ok()) return sync.status();
  const bool synced = *sync != nullptr && PQresultStatus(*sync) == PGRES_PIPELINE_SYNC;
  PQclear(*sync);
  if (!synced || PQexitPipelineMode(conn_.get()) != 1) {
    return Abandon(PgStatus(nullptr, conn_.get(), "PostgreSQL: pipeline end", redacted_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Result>> Connection::Pipeline(absl::Span<const Statement> statements,
                                                         absl::Time deadline, size_t* failed_at) {
  if (failed_at != nullptr) *failed_at = statements.size();
  if (PQenterPipelineMode(conn_.get()) != 1) {
    return Abandon(PgStatus(nullptr, conn_.get(), "PostgreSQL: pipeline mode", redacted_));
  }
  std::vector<std::string> preparing(statements.size());
  if (absl::Status st = SendStatements(statements, preparing); !st.ok()) return st;
  if (absl::Status st = FlushPipeline(deadline); !st.ok()) return st;
  PipelineError error;
  std::vector<Result> results;
  results.reserve(statements.size());
  for (size_t i = 0; i < statements.size(); ++i) {
    if (!preparing[i].empty()) {
      // The Parse of a statement prepared now: remembered once the server took it.
      absl::StatusOr<std::optional<Result>> p = ReadOne(i, /*rows=*/false, deadline, error);
      if (!p.ok()) return p.status();
      if (p->has_value()) prepared_.emplace(*statements[i].sql, preparing[i]);
    }
    absl::StatusOr<std::optional<Result>> r = ReadOne(i, /*rows=*/true, deadline, error);
    if (!r.ok()) return r.status();
    if (r->has_value()) results.push_back(std::move(**r));
  }
  if (absl::Status st = EndPipeline(deadline); !st.ok()) return st;
  if (!error.status.ok()) {
    if (failed_at != nullptr) *failed_at = error.at;
    return error.status;
  }
  return results;
}

}  // namespace bus::pg_internal
