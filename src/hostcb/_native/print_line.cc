// hostcb native engine: the text of a `debug.print` line, made in C for the
// common case of one 0-d number in plain `{}` fields.
//
// `hostcb.debug.print("x={}", x)` with x a 0-d float, integer or bool
// array prints what Python's `"x={}".format(number)` gives for the Python
// number of the value (hostcb.debug: _SCALAR_TYPES): `repr` of a float for
// float16/32/64, the decimal digits of an int, `True`/`False`.  Python's
// `repr(float)` is the shortest string that reads back as the same double
// (David Gay's dtoa, mode 0, laid out by PyOS_double_to_string); the C++17
// `std::to_chars` in its shortest form gives the same digits (Ryu: the
// shortest string, the one nearest the value among several, a tie to the
// even digit), which are laid out here as Python lays them out.
// tests/test_print_line.py compares the two over every float16, a sample
// of float32 and float64 values, and the special values.
//
// tests/native/print_line_check.cc compares it with CPython's repr over
// every 4093rd float32 and a million doubles (all 2^32 float32 by hand).
//
// The consumer (module.cc, run_batch's BuildLine) calls PrintLineOfOperand
// with the GIL held, on the record's bytes: it replaces the NumPy array,
// NumPy's conversion to a Python number, the number's formatting and the
// string's concatenation (about 0.5 µs per line) by about 0.05 µs.
// PrintLineText (the module's print_line_text, for tests) formats a 0-d
// NumPy array through the same path.
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>

#include "pyarrays.h"

// The shortest floating-point std::to_chars came with GCC 11 and LLVM 14's
// libc++ (__cpp_lib_to_chars); an older library builds the engine without
// this, and Python formats every line (FORMATS_PRINT_LINES is 0).
// HOSTCB_NO_PRINT_LINES builds that variant on purpose.
#if defined(__cpp_lib_to_chars) && !defined(HOSTCB_NO_PRINT_LINES)
#define HOSTCB_PRINT_LINES 1
#else
#define HOSTCB_PRINT_LINES 0
#endif

namespace hostcb {

// array_text.cc: appends numpy.array2string's text of the array, or
// returns false where NumPy formats it.
bool AppendArrayText(int32_t dtype, int32_t rank, const int64_t* dims,
                     const void* data, int flags, int64_t threshold,
                     std::string* out);

extern const bool kFormatsPrintLines = HOSTCB_PRINT_LINES;

#if HOSTCB_PRINT_LINES
namespace {

// The double of an IEEE binary16 value (exact: every half is a double).
double HalfToDouble(uint16_t h) {
  const bool negative = (h & 0x8000) != 0;
  const int exponent = (h >> 10) & 0x1f;
  const int fraction = h & 0x3ff;
  double magnitude;
  if (exponent == 0) {  // zero or subnormal: fraction * 2^-24
    magnitude = std::ldexp(static_cast<double>(fraction), -24);
  } else if (exponent == 0x1f) {
    magnitude = fraction == 0 ? HUGE_VAL : std::nan("");
  } else {  // (1024 + fraction) * 2^(exponent - 25)
    magnitude =
        std::ldexp(static_cast<double>(0x400 | fraction), exponent - 25);
  }
  return negative ? -magnitude : magnitude;
}

// Appends Python's repr of `x` (float_repr_style 'short') to `out`.
void AppendRepr(double x, std::string* out) {
  if (std::isnan(x)) {  // the sign of a NaN is not shown
    out->append("nan");
    return;
  }
  if (std::isinf(x)) {
    out->append(x < 0 ? "-inf" : "inf");
    return;
  }
  // The shortest digits in scientific form: [-]d[.ddd]e(+|-)XX.
  char buf[40];
  std::to_chars_result r =
      std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  const char* p = buf;
  const char* end = r.ptr;
  if (*p == '-') {
    out->push_back('-');
    ++p;
  }
  char digits[24];
  int n = 0;
  for (; p < end && *p != 'e'; ++p) {
    if (*p != '.') digits[n++] = *p;
  }
  int exponent = 0;
  std::from_chars(p + (p[1] == '+' ? 2 : 1), end, exponent);  // after 'e'
  // The decimal point sits `point` digits after the first one (dtoa's
  // decpt).  Python's layout: scientific where point <= -4 or point > 16,
  // else positional, with ".0" after an integer.
  const int point = exponent + 1;
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out->append("0.");
      out->append(static_cast<size_t>(-point), '0');
      out->append(digits, static_cast<size_t>(n));
    } else if (point >= n) {
      out->append(digits, static_cast<size_t>(n));
      out->append(static_cast<size_t>(point - n), '0');
      out->append(".0");
    } else {
      out->append(digits, static_cast<size_t>(point));
      out->push_back('.');
      out->append(digits + point, static_cast<size_t>(n - point));
    }
    return;
  }
  out->push_back(digits[0]);
  if (n > 1) {
    out->push_back('.');
    out->append(digits + 1, static_cast<size_t>(n - 1));
  }
  const int shown = point - 1;
  out->push_back('e');
  out->push_back(shown < 0 ? '-' : '+');
  const int magnitude = shown < 0 ? -shown : shown;
  if (magnitude < 10) out->push_back('0');  // at least two digits
  out->append(std::to_string(magnitude));
}

template <typename T>
void AppendInteger(T value, std::string* out) {
  char buf[24];
  std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  out->append(buf, r.ptr);
}

template <typename T>
T Load(const void* data) {
  T value;
  std::memcpy(&value, data, sizeof(T));
  return value;
}

// The numbers this formats, by how Python shows them.
enum class Scalar { kNone, kF16, kF32, kF64, kBool, kI8, kI16, kI32, kI64 };
struct Kind {
  Scalar scalar = Scalar::kNone;
  bool is_unsigned = false;  // of an integer
};

Kind KindOfXla(int32_t code) {
  using xla::ffi::DataType;
  switch (static_cast<DataType>(code)) {
    case DataType::F16:
      return {Scalar::kF16};
    case DataType::F32:
      return {Scalar::kF32};
    case DataType::F64:
      return {Scalar::kF64};
    case DataType::PRED:
      return {Scalar::kBool};
    case DataType::S8:
      return {Scalar::kI8};
    case DataType::S16:
      return {Scalar::kI16};
    case DataType::S32:
      return {Scalar::kI32};
    case DataType::S64:
      return {Scalar::kI64};
    case DataType::U8:
      return {Scalar::kI8, true};
    case DataType::U16:
      return {Scalar::kI16, true};
    case DataType::U32:
      return {Scalar::kI32, true};
    case DataType::U64:
      return {Scalar::kI64, true};
    default:
      return {};
  }
}

template <typename Signed, typename Unsigned>
void AppendIntegerAt(bool is_unsigned, const void* data, std::string* out) {
  if (is_unsigned) {
    AppendInteger(Load<Unsigned>(data), out);
  } else {
    AppendInteger(Load<Signed>(data), out);
  }
}

// Appends the text of the number of kind `k` at `data`.
void AppendValue(Kind k, const void* data, std::string* out) {
  switch (k.scalar) {
    case Scalar::kF16:
      AppendRepr(HalfToDouble(Load<uint16_t>(data)), out);
      return;
    case Scalar::kF32:
      AppendRepr(static_cast<double>(Load<float>(data)), out);
      return;
    case Scalar::kF64:
      AppendRepr(Load<double>(data), out);
      return;
    case Scalar::kBool:
      out->append(Load<uint8_t>(data) != 0 ? "True" : "False");
      return;
    case Scalar::kI8:
      AppendIntegerAt<int8_t, uint8_t>(k.is_unsigned, data, out);
      return;
    case Scalar::kI16:
      AppendIntegerAt<int16_t, uint16_t>(k.is_unsigned, data, out);
      return;
    case Scalar::kI32:
      AppendIntegerAt<int32_t, uint32_t>(k.is_unsigned, data, out);
      return;
    case Scalar::kI64:
      AppendIntegerAt<int64_t, uint64_t>(k.is_unsigned, data, out);
      return;
    case Scalar::kNone:
      return;
  }
}

// Whether `pieces` is what a line entry holds; sets a TypeError if not.
bool CheckPieces(PyObject* pieces) {
  if (PyTuple_CheckExact(pieces) && PyTuple_GET_SIZE(pieces) >= 2) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pieces); ++i) {
      if (!PyBytes_CheckExact(PyTuple_GET_ITEM(pieces, i))) {
        PyErr_SetString(PyExc_TypeError,
                        "print_line_text takes the text around each field "
                        "as UTF-8 bytes");
        return false;
      }
    }
    return true;
  }
  PyErr_SetString(PyExc_TypeError,
                  "print_line_text takes a tuple of at least two bytes "
                  "(the text around each field)");
  return false;
}

// The line: the (checked) pieces joined by the value's text, and a newline.
PyObject* JoinedLine(PyObject* pieces, const std::string& value);

PyObject* Line(PyObject* pieces, Kind k, const void* data) {
  std::string value;
  AppendValue(k, data, &value);
  return JoinedLine(pieces, value);
}

// The line: the (checked) pieces joined by `value`, and a newline.
PyObject* JoinedLine(PyObject* pieces, const std::string& value) {
  std::string text;
  const Py_ssize_t n = PyTuple_GET_SIZE(pieces);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* piece = PyTuple_GET_ITEM(pieces, i);
    if (i > 0) text.append(value);
    text.append(PyBytes_AS_STRING(piece),
                static_cast<size_t>(PyBytes_GET_SIZE(piece)));
  }
  text.push_back('\n');
  return PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()),
                              "strict");
}

}  // namespace

PyObject* ArrayLineOfOperand(PyObject* pieces, int32_t dtype, int32_t rank,
                             const int64_t* dims, const void* data, long flags,
                             long long threshold) {
  if (!CheckPieces(pieces)) return nullptr;
  std::string value;
  if (!AppendArrayText(dtype, rank, dims, data, static_cast<int>(flags),
                       threshold, &value)) {
    return nullptr;
  }
  return JoinedLine(pieces, value);
}

PyObject* PrintLineOfOperand(PyObject* pieces, int32_t dtype, int32_t rank,
                             const void* data) {
  if (!CheckPieces(pieces)) return nullptr;
  const Kind k = KindOfXla(dtype);
  if (rank != 0 || k.scalar == Scalar::kNone) return nullptr;
  return Line(pieces, k, data);
}

PyObject* PrintLineText(PyObject* pieces, PyObject* array) {
  if (!PyArray_CheckExact(array)) {
    CheckPieces(pieces);  // a TypeError for bad pieces, else Python's value
    return nullptr;
  }
  auto* a = reinterpret_cast<PyArrayObject*>(array);
  // As the record of a tap of it: its XLA dtype (the engine's table), or
  // none for a byte order that XLA never hands over.
  const int dtype = PyArray_ISNOTSWAPPED(a) ? DtypeCode(a) : -1;
  return PrintLineOfOperand(pieces, dtype, PyArray_NDIM(a), PyArray_DATA(a));
}

#else  // HOSTCB_PRINT_LINES: Python formats every line

PyObject* PrintLineText(PyObject*, PyObject*) { return nullptr; }

PyObject* ArrayLineOfOperand(PyObject*, int32_t, int32_t, const int64_t*,
                             const void*, long, long long) {
  return nullptr;
}

PyObject* PrintLineOfOperand(PyObject*, int32_t, int32_t, const void*) {
  return nullptr;
}

#endif  // HOSTCB_PRINT_LINES

}  // namespace hostcb
