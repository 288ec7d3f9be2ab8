// What a thread that Python ends at shutdown does inside C++ code.
//
// Up to Python 3.13, a thread other than the main one that takes the GIL
// after finalization has begun is ended by pthread_exit: a forced unwind
// through the C++ frames on its stack.  A daemon thread that taps forever
// does that inside jaxlib (the destructor of a jax.Array releases the GIL
// and takes it back; an XLA thread may run a host function), and where the
// unwind meets a noexcept frame it calls std::terminate: the process aborts
// at exit, after the program's work is done ("terminate called without an
// active exception" on 3.13, "FATAL: exception not rethrown" on 3.11), with
// or without hostcb.  Python 3.14 instead leaves such a thread blocked
// forever, and hostcb does the same on the Pythons before: its terminate
// handler blocks the thread for good when Python is finalizing and the
// thread is not the main one (the one that finalizes).  Every other
// std::terminate goes on to the handler installed before, unchanged.
//
// A parked thread may hold a lock of XLA's (it was unwinding from inside
// jaxlib), and the main thread, finalizing, may then need that lock (a
// jax.Array destroyed during teardown): parking for good would turn the
// abort into a hang.  So a parked thread waits at most
// kParkSeconds: if the main thread finishes finalizing in that time, the
// process exits and the parked thread with it (the usual case: it holds
// nothing the main thread needs); if not, the main thread is stuck, maybe
// on that thread, and the parked thread goes on to the previous handler,
// which aborts the process as it would have done without hostcb.  A hang
// at exit is at most kParkSeconds long.
//
// The handler is installed when the first program that taps is traced
// (hostcb._engine.lifecycle), not at import, and hostcb.uninstall() puts
// the previous one back.
#include "pyarrays.h"  // Python.h, PythonIsFinalizing
#include <unistd.h>

#include <ctime>
#include <cstdlib>
#include <exception>

namespace hostcb {
namespace {

constexpr int kParkSeconds = 10;

std::terminate_handler g_previous = nullptr;
bool g_installed = false;
unsigned long g_main_thread = 0;  // threading.main_thread().ident

[[noreturn]] void OnTerminate() {
  // Both reads are safe without the GIL (an atomic load, pthread_self).
  if (PythonIsFinalizing() && PyThread_get_thread_ident() != g_main_thread) {
    // nanosleep resumes after a signal handler with the time left.
    timespec left{kParkSeconds, 0};
    while (nanosleep(&left, &left) != 0) {
    }
  }
  if (g_previous != nullptr) g_previous();
  std::abort();
}

}  // namespace

// Installs the handler (once while installed); called with the GIL held.
int InstallExitGuard() {
  if (g_installed) return 0;
  PyObject* threading = PyImport_ImportModule("threading");
  if (threading == nullptr) return -1;
  PyObject* main = PyObject_CallMethod(threading, "main_thread", nullptr);
  Py_DECREF(threading);
  if (main == nullptr) return -1;
  PyObject* ident = PyObject_GetAttrString(main, "ident");
  Py_DECREF(main);
  if (ident == nullptr) return -1;
  g_main_thread = PyLong_AsUnsignedLong(ident);
  Py_DECREF(ident);
  if (PyErr_Occurred()) return -1;
  g_installed = true;
  g_previous = std::set_terminate(OnTerminate);
  return 0;
}

// Puts back the handler that was there before; returns false (and changes
// nothing) where another handler replaced hostcb's since.
bool UninstallExitGuard() {
  if (!g_installed) return true;
  std::terminate_handler current = std::get_terminate();
  if (current != OnTerminate) return false;
  std::set_terminate(g_previous);
  g_installed = false;
  return true;
}

// In a child after fork, the thread that forked is the child's main thread
// (Python makes it so): the one that will finalize.
void ExitGuardAfterForkInChild() {
  g_main_thread = PyThread_get_thread_ident();
}

}  // namespace hostcb
