// Browser: Debian's headless chromium driven from a test through the DevTools protocol over a
// local WebSocket (Boost.Beast), for the console's browser tests. It opens one page and keeps
// what the page did: every network request, every JavaScript dialog (alert, confirm, prompt:
// dismissed at once) and every console and log message (a CSP violation is one).
//
//   absl::StatusOr<std::unique_ptr<Browser>> b = Browser::Start();
//   ASSERT_TRUE((*b)->Navigate("http://127.0.0.1:9090/ui").ok());
//   ASSERT_TRUE((*b)->WaitFor("document.querySelector('#queues') !== null"));
//   EXPECT_TRUE((*b)->dialogs().empty());
//
// The browser is $BUS_CHROMIUM, else /usr/lib/chromium/chromium, else `chromium` on PATH
// (tools/setup.sh installs it); FailedPrecondition when there is none. Every wait is bounded
// by a generous patience, never a fixed sleep.
//
// Thread-safety: one thread uses a Browser.

#ifndef TESTS_TESTING_CHROMIUM_H_
#define TESTS_TESTING_CHROMIUM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace bus::testing {

class Browser {
 public:
  // Starts chromium with a fresh profile and a window of `width` x `height`, opens a blank page.
  static absl::StatusOr<std::unique_ptr<Browser>> Start(int width = 1280, int height = 800);

  // Closes the browser and removes its profile.
  ~Browser();
  Browser(const Browser&) = delete;
  Browser& operator=(const Browser&) = delete;

  // Opens `url` and waits for its load event.
  absl::Status Navigate(const std::string& url);

  // Evaluates `expression` in the page (a promise is awaited) and returns its value as JSON.
  // The exception's text when it throws.
  absl::StatusOr<nlohmann::json> Eval(const std::string& expression);

  // Polls `expression` until it is true (or `patience` passes: false).
  bool WaitFor(const std::string& expression, absl::Duration patience = absl::Seconds(60));

  // Writes a PNG of the whole page to `path`.
  absl::Status Screenshot(const std::string& path);

  // A DevTools command in the page's session; its result.
  absl::StatusOr<nlohmann::json> Command(const std::string& method,
                                         const nlohmann::json& params = nlohmann::json::object());

  // What the page did so far (events read while commands ran).
  const std::vector<std::string>& requests() const { return requests_; }
  const std::vector<std::string>& dialogs() const { return dialogs_; }
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  struct Conn;
  Browser() = default;
  absl::StatusOr<nlohmann::json> Send(const std::string& method, const nlohmann::json& params,
                                      const std::string& session);
  void OnEvent(const nlohmann::json& event);

  std::unique_ptr<Conn> conn_;
  std::string session_;
  std::string profile_;
  int next_id_ = 1;
  bool loaded_ = false;
  std::vector<std::string> requests_;
  std::vector<std::string> dialogs_;
  std::vector<std::string> messages_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_CHROMIUM_H_
