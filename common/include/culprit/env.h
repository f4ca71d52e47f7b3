// The environment the harness's background I/O runs in, as a seam (LevelDB's Env and EnvWrapper
// are the model): production code calls Env::Default(); a test wraps it and overrides the one
// operation it wants to change (today: a slow copy of the checkpoint's state) without a hook in
// production code or an environment variable a user could set by accident. An operation a test
// needs to change is added here, with its default in env.cpp.
#pragma once
#include <functional>

namespace culprit {

class Env {
 public:
  virtual ~Env() = default;
  // The process's own: every operation done as it is. Never deleted.
  static Env* Default();

  // Runs `copy`, the copy of a checkpoint's state to host buffers (checkpoint pipeline, I/O thread).
  // A wrapper may delay or observe it; it must run it exactly once.
  virtual void copy_state(const std::function<void()>& copy) = 0;
};

// Forwards every call to another Env: a test overrides only what it changes.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }
  void copy_state(const std::function<void()>& copy) override { target_->copy_state(copy); }

 private:
  Env* target_;
};

}  // namespace culprit
