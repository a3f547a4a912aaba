#include "tests/testing/chromium.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core/buffers_to_string.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/websocket.hpp"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace bus::testing {

namespace asio = boost::asio;
namespace websocket = boost::beast::websocket;
using json = nlohmann::json;

// Bound on one DevTools round trip (a loaded 2-core machine renders slowly).
constexpr absl::Duration kReplyPatience = absl::Seconds(90);

struct Browser::Conn {
  std::unique_ptr<ChildProcess> child;
  asio::io_context io;
  websocket::stream<asio::ip::tcp::socket> ws{io};
};

namespace {

// Polls `cond` every 50ms until it holds or `patience` passes (each poll is a DevTools round
// trip: a tighter loop would only load the machine).
bool Poll(const std::function<bool()>& cond, absl::Duration patience) {
  const absl::Time deadline = absl::Now() + patience;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

std::string ChromiumPath() {
  if (const char* env = std::getenv("BUS_CHROMIUM"); env != nullptr && *env != '\0') return env;
  if (access("/usr/lib/chromium/chromium", X_OK) == 0) return "/usr/lib/chromium/chromium";
  return "chromium";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Browser>> Browser::Start(int width, int height) {
  const std::string exe = ChromiumPath();
  if (exe == "chromium" && system("command -v chromium >/dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError("chromium is not installed (run tools/setup.sh)");
  }
  std::unique_ptr<Browser> b(new Browser());
  b->profile_ = MakeTempDir("chromium-profile");
  b->conn_ = std::make_unique<Conn>();
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
      {exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
       "--no-first-run", "--no-default-browser-check", "--disable-extensions",
       "--disable-background-networking", "--disable-sync", "--disable-component-update",
       "--disable-features=Translate,MediaRouter", "--hide-scrollbars", "--mute-audio",
       absl::StrCat("--window-size=", width, ",", height), "--remote-debugging-address=127.0.0.1",
       "--remote-debugging-port=0", absl::StrCat("--user-data-dir=", b->profile_), "about:blank"},
      b->profile_ + ".log");
  if (!child.ok()) return child.status();
  b->conn_->child = std::move(*child);

  // The browser writes its DevTools port and path to the profile once it listens.
  int port = 0;
  std::string path;
  const bool listening = WaitUntil(
      [&] {
        std::ifstream in(b->profile_ + "/DevToolsActivePort");
        std::string first;
        return std::getline(in, first) && std::getline(in, path) &&
               absl::SimpleAtoi(first, &port) && port > 0 && !path.empty();
      },
      absl::Seconds(90));
  if (!listening) {
    return absl::UnavailableError(
        absl::StrCat("chromium did not start its DevTools endpoint (log: ", b->profile_, ".log)"));
  }
  boost::system::error_code ec;
  asio::ip::tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port));
  b->conn_->ws.next_layer().connect(ep, ec);
  if (!ec) {
    // A bound on every read, so a browser that stops answering fails the test instead of
    // hanging it.
    timeval tv{static_cast<time_t>(absl::ToInt64Seconds(kReplyPatience)), 0};
    setsockopt(b->conn_->ws.next_layer().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    b->conn_->ws.read_message_max(64 << 20);
    b->conn_->ws.handshake(absl::StrCat("127.0.0.1:", port), path, ec);
  }
  if (ec) return absl::UnavailableError(absl::StrCat("DevTools connect: ", ec.message()));

  absl::StatusOr<json> target = b->Send("Target.createTarget", {{"url", "about:blank"}}, "");
  if (!target.ok()) return target.status();
  absl::StatusOr<json> attached = b->Send(
      "Target.attachToTarget", {{"targetId", (*target)["targetId"]}, {"flatten", true}}, "");
  if (!attached.ok()) return attached.status();
  b->session_ = (*attached)["sessionId"].get<std::string>();
  for (const char* domain : {"Page.enable", "Runtime.enable", "Network.enable", "Log.enable"}) {
    if (absl::StatusOr<json> r = b->Command(domain); !r.ok()) return r.status();
  }
  if (absl::StatusOr<json> r = b->Command(
          "Emulation.setDeviceMetricsOverride",
          {{"width", width}, {"height", height}, {"deviceScaleFactor", 1}, {"mobile", false}});
      !r.ok()) {
    return r.status();
  }
  return b;
}

Browser::~Browser() {
  if (conn_ == nullptr) return;
  if (conn_->ws.is_open()) {
    boost::system::error_code ec;
    conn_->ws.write(asio::buffer(json({{"id", next_id_++}, {"method", "Browser.close"}}).dump()),
                    ec);
  }
  if (conn_->child != nullptr && !conn_->child->Wait(absl::Seconds(20)).ok()) conn_->child->Kill();
  RemoveTree(profile_);
}

void Browser::OnEvent(const json& event) {
  const std::string method = event.value("method", "");
  const json& params = event.contains("params") ? event["params"] : json::object();
  if (method == "Network.requestWillBeSent") {
    requests_.push_back(params["request"].value("url", ""));
  } else if (method == "Page.javascriptDialogOpening") {
    dialogs_.push_back(absl::StrCat(params.value("type", ""), ": ", params.value("message", "")));
    // Dismissed at once, or the page would stop; the reply is read (and dropped) later.
    json cmd = {{"id", next_id_++},
                {"method", "Page.handleJavaScriptDialog"},
                {"params", {{"accept", false}}},
                {"sessionId", session_}};
    boost::system::error_code ec;
    conn_->ws.write(asio::buffer(cmd.dump()), ec);
  } else if (method == "Runtime.consoleAPICalled") {
    std::string text = params.value("type", "");
    for (const json& a : params["args"]) {
      absl::StrAppend(&text, " ", a.contains("value") ? a["value"].dump() : a.value("type", ""));
    }
    messages_.push_back(text);
  } else if (method == "Log.entryAdded") {
    messages_.push_back(params["entry"].value("text", ""));
  } else if (method == "Runtime.exceptionThrown") {
    messages_.push_back(
        absl::StrCat("exception: ", params["exceptionDetails"].value("text", ""), " ",
                     params["exceptionDetails"].contains("exception")
                         ? params["exceptionDetails"]["exception"].value("description", "")
                         : ""));
  } else if (method == "Page.loadEventFired") {
    loaded_ = true;
  }
}

absl::StatusOr<json> Browser::Send(const std::string& method, const json& params,
                                   const std::string& session) {
  const int id = next_id_++;
  json cmd = {{"id", id}, {"method", method}, {"params", params}};
  if (!session.empty()) cmd["sessionId"] = session;
  boost::system::error_code ec;
  conn_->ws.write(asio::buffer(cmd.dump()), ec);
  if (ec) return absl::UnavailableError(absl::StrCat("DevTools write: ", ec.message()));
  for (;;) {
    boost::beast::flat_buffer buf;
    conn_->ws.read(buf, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("DevTools read (", method, "): ", ec.message()));
    }
    json msg = json::parse(boost::beast::buffers_to_string(buf.data()), nullptr, false);
    if (msg.is_discarded()) continue;
    if (!msg.contains("id")) {
      OnEvent(msg);
      continue;
    }
    if (msg["id"] != id) continue;
    if (msg.contains("error")) {
      return absl::InternalError(absl::StrCat(method, ": ", msg["error"].dump()));
    }
    return msg.value("result", json::object());
  }
}

absl::StatusOr<json> Browser::Command(const std::string& method, const json& params) {
  return Send(method, params, session_);
}

absl::Status Browser::Navigate(const std::string& url) {
  loaded_ = false;
  absl::StatusOr<json> r = Command("Page.navigate", {{"url", url}});
  if (!r.ok()) return r.status();
  if (r->contains("errorText")) {
    return absl::UnavailableError(absl::StrCat("navigate: ", (*r)["errorText"].dump()));
  }
  // Events arrive while commands run: poll with a cheap one until the load event came.
  const bool loaded = Poll(
      [&] { return Eval("document.readyState === 'complete'").value_or(false) == true && loaded_; },
      kReplyPatience);
  return loaded ? absl::OkStatus() : absl::DeadlineExceededError("page did not load");
}

absl::StatusOr<json> Browser::Eval(const std::string& expression) {
  absl::StatusOr<json> r =
      Command("Runtime.evaluate",
              {{"expression", expression}, {"returnByValue", true}, {"awaitPromise", true}});
  if (!r.ok()) return r.status();
  if (r->contains("exceptionDetails")) {
    return absl::InternalError(absl::StrCat("page: ", (*r)["exceptionDetails"].dump()));
  }
  return (*r)["result"].value("value", json());
}

bool Browser::WaitFor(const std::string& expression, absl::Duration patience) {
  return Poll(
      [&] {
        absl::StatusOr<json> v = Eval(absl::StrCat("!!(", expression, ")"));
        return v.ok() && *v == true;
      },
      patience);
}

absl::Status Browser::Screenshot(const std::string& path) {
  absl::StatusOr<json> r =
      Command("Page.captureScreenshot", {{"format", "png"}, {"captureBeyondViewport", false}});
  if (!r.ok()) return r.status();
  std::string png;
  if (!absl::Base64Unescape((*r)["data"].get<std::string>(), &png)) {
    return absl::InternalError("screenshot: bad base64");
  }
  std::ofstream out(path, std::ios::binary);
  out << png;
  return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

}  // namespace bus::testing
