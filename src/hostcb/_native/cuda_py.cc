// hostcb native engine: the Python functions of the GPU back end (cuda.cc),
// added to hostcb._native._engine by PyInit__engine (module.cc).  The test
// build adds those of the simulated driver (tests/native/engine_testing.cc).
#include <string>

#include "cuda_api.h"
#include "pyarrays.h"

namespace hostcb {
namespace {

PyObject* Capsule(void* fn) { return PyCapsule_New(fn, nullptr, nullptr); }

PyObject* Py_cuda_handlers(PyObject*, PyObject*) {
  return Py_BuildValue(
      "{s:N,s:N,s:N,s:N,s:N,s:N}", "hostcb_tap",
      Capsule(reinterpret_cast<void*>(&HostcbTapCuda)), "hostcb_tap_v1",
      Capsule(reinterpret_cast<void*>(&HostcbTapCudaV1)), "hostcb_call_v1",
      Capsule(reinterpret_cast<void*>(&HostcbCallCudaV1)), "hostcb_noop",
      Capsule(reinterpret_cast<void*>(&HostcbNoop)), "hostcb_call",
      Capsule(reinterpret_cast<void*>(&HostcbCallCuda)), "hostcb_call_one",
      Capsule(reinterpret_cast<void*>(&HostcbCallOneCuda)));
}

PyObject* Py_load_cuda(PyObject*, PyObject*) {
  std::string error;
  Py_BEGIN_ALLOW_THREADS error = cuda::LoadCuda();
  Py_END_ALLOW_THREADS if (error.empty()) Py_RETURN_NONE;
  return PyUnicode_FromString(error.c_str());
}

PyObject* Py_gpu_pinned_bytes(PyObject*, PyObject* arg) {
  const long ordinal = PyLong_AsLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return PyLong_FromUnsignedLongLong(
      GpuPinnedBytes(static_cast<int32_t>(ordinal)));
}

PyObject* Py_gpu_pin_refusal(PyObject*, PyObject* arg) {
  const long ordinal = PyLong_AsLong(arg);
  if (PyErr_Occurred()) return nullptr;
  const std::string name = GpuPinRefusal(static_cast<int32_t>(ordinal));
  if (name.empty()) Py_RETURN_NONE;
  return PyUnicode_FromString(name.c_str());
}

PyObject* Py_gpu_publication(PyObject*, PyObject*) {
  const std::string why = GpuPublication();
  if (why.empty()) Py_RETURN_NONE;
  return PyUnicode_FromString(why.c_str());
}

PyMethodDef kCudaMethods[] = {
    {"cuda_handlers", Py_cuda_handlers, METH_NOARGS,
     "{name: PyCapsule} of the CUDA handlers (and the empty one), for "
     "register_ffi_target with "
     "platform 'CUDA'."},
    {"load_cuda", Py_load_cuda, METH_NOARGS,
     "load_cuda() -> None, or why the CUDA driver cannot be used."},
    {"gpu_pinned_bytes", Py_gpu_pinned_bytes, METH_O,
     "gpu_pinned_bytes(ordinal): bytes of that GPU's ring that are pinned."},
    {"gpu_pin_refusal", Py_gpu_pin_refusal, METH_O,
     "gpu_pin_refusal(ordinal): the CUDA error of the first chunk of that "
     "GPU's ring that the driver refused to pin, or None."},
    {"gpu_publication", Py_gpu_publication, METH_NOARGS,
     "gpu_publication(): None where the streams publish GPU taps by "
     "writing a ready word, else why host functions publish them."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int AddCudaFunctions(PyObject* module) {
  if (PyModule_AddFunctions(module, kCudaMethods) < 0) return -1;
  return PyModule_AddIntConstant(module, "GPU_KEY_BASE", kGpuKeyBase);
}

}  // namespace hostcb
