// hostcb native engine: the text of `numpy.array2string(a)` under NumPy's
// default print options, for arrays of bool, the integer types, float32
// and float64 that are not summarized (size <= threshold).
//
// What NumPy does (arrayprint: FloatingFormat, IntegerFormat, BoolFormat,
// _formatArray; the same in NumPy 1.26 and 2.x but for the two flags of
// ArrayTextFlags), done here from the array's bytes:
//
// * floats: the finite non-zero magnitudes choose scientific form (max >=
//   the cut-off, min < 0.0001, or max / min > 1000, in the dtype's
//   arithmetic); a first text of each finite value (the shortest digits
//   that read back as the same value of its dtype, cut at 8 digits after
//   the point and then rounded, trailing zeros trimmed) sizes the parts;
//   the second pads them: positional values to the widest integer part
//   (spaces before) and fraction (spaces after), scientific ones to the
//   longest fraction (zeros) and exponent; nan/inf right-aligned;
// * integers right-aligned to the widest; bools ` True`/`False` (a 0-d
//   one `True`);
// * rows wrapped at 75 columns, nested brackets, a blank line per level.
//
// The shortest digits are std::to_chars' (Ryu): the same as NumPy's
// Dragon4 except where the shortest candidate lies exactly on the rounding
// boundary of the value (halfway to a neighbour), where NumPy's two texts
// of the value differ among themselves: such a value makes the whole array
// fall back to NumPy (AppendArrayText returns false).  Rounding at the cut
// is to_chars' with a precision: the exact value, correctly rounded, a tie
// to the even digit, as Dragon4 rounds.  tests/test_native_array_text.py
// compares the text with NumPy's over random and edge values.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pyarrays.h"

#if defined(__cpp_lib_to_chars) && !defined(HOSTCB_NO_PRINT_LINES)
#define HOSTCB_ARRAY_TEXT 1
#else
#define HOSTCB_ARRAY_TEXT 0
#endif

namespace hostcb {

// The NumPy behaviours that differ between versions (array_text.py gives
// them for the NumPy that runs).
enum ArrayTextFlags : int {
  // NumPy 2 compares a float32 magnitude with 0.0001 as a float32 (NEP
  // 50); NumPy 1 as a double.
  kCompareInDtype = 1,
  // NumPy 2.3 on: float32 values switch to scientific form from 1e6 (10 **
  // min(8, precision)), not 1e8.
  kCutoffByDtype = 2,
};

#if HOSTCB_ARRAY_TEXT
namespace {

constexpr int kPrecision = 8;
constexpr int kLineWidth = 75;

// One finite value's first text, in parts.
struct Parts {
  std::string whole;     // with the sign: "-12", "0"
  std::string fraction;  // after the point: "5", "" (trimmed)
  std::string exponent;  // scientific only: "+08", "-100"
};

template <typename T>
struct Bits;
template <>
struct Bits<float> {
  static constexpr int kDigits = 24, kMinExponent = -149;
};
template <>
struct Bits<double> {
  static constexpr int kDigits = 53, kMinExponent = -1074;
};

// Whether D * 10^k == n * 2^f exactly (n odd, positive).
bool DecimalIs(uint64_t d, int k, uint64_t n, int f) {
  int twos = 0, fives = 0;
  while (d % 2 == 0) d /= 2, ++twos;
  while (d % 5 == 0) d /= 5, ++fives;
  if (twos + k != f || fives + k < 0) return false;
  unsigned __int128 v = d;
  for (int i = 0; i < fives + k; ++i) {
    v *= 5;
    if (v > n) return false;
  }
  return v == n;
}

// Whether the decimal digits[0..n) * 10^(exponent - n + 1) lies exactly
// halfway between |x| and a neighbour (the boundary of its rounding).
template <typename T>
bool OnBoundary(T x, const char* digits, int n, int exponent) {
  uint64_t d = 0;
  for (int i = 0; i < n; ++i)
    d = d * 10 + static_cast<uint64_t>(digits[i] - '0');
  if (d == 0) return false;
  int e2 = 0;
  const double f = std::frexp(static_cast<double>(std::fabs(x)), &e2);
  constexpr int p = Bits<T>::kDigits;
  uint64_t m = static_cast<uint64_t>(std::ldexp(f, p));
  int e = e2 - p;
  if (e < Bits<T>::kMinExponent) {  // subnormal: fewer digits
    m >>= (Bits<T>::kMinExponent - e);
    e = Bits<T>::kMinExponent;
  }
  const int k = exponent - n + 1;
  if (DecimalIs(d, k, 2 * m + 1, e - 1)) return true;
  if (m == (uint64_t{1} << (p - 1)) && e > Bits<T>::kMinExponent) {
    return DecimalIs(d, k, 4 * m - 1, e - 2);
  }
  return DecimalIs(d, k, 2 * m - 1, e - 1);
}

// Splits "[-]d[.ddd]e(+|-)dd" into sign, digits and exponent.
void Split(const char* p, const char* end, bool* negative, std::string* digits,
           int* exponent) {
  *negative = *p == '-';
  if (*negative) ++p;
  digits->clear();
  for (; p < end && *p != 'e'; ++p) {
    if (*p != '.') digits->push_back(*p);
  }
  *exponent = 0;
  const bool minus = p + 1 < end && p[1] == '-';
  std::from_chars(p + 2, end, *exponent);
  if (minus) *exponent = -*exponent;
}

void TrimZeros(std::string* s) {
  while (!s->empty() && s->back() == '0') s->pop_back();
}

// The first text of finite x; false where NumPy's digits may differ.
template <typename T>
bool FirstText(T x, bool scientific, Parts* out) {
  char buf[400];
  auto r =
      std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  bool negative;
  std::string digits;
  int exponent;
  Split(buf, r.ptr, &negative, &digits, &exponent);
  const int n = static_cast<int>(digits.size());
  if (OnBoundary(x, digits.data(), n, exponent)) return false;
  const std::string sign = negative ? "-" : "";
  if (scientific) {
    if (n - 1 > kPrecision) {  // cut: the exact value, rounded
      r = std::to_chars(buf, buf + sizeof(buf), x,
                        std::chars_format::scientific, kPrecision);
      Split(buf, r.ptr, &negative, &digits, &exponent);
    }
    out->whole = sign + digits.substr(0, 1);
    out->fraction = digits.substr(1);
    TrimZeros(&out->fraction);
    const int magnitude = exponent < 0 ? -exponent : exponent;
    out->exponent = exponent < 0 ? "-" : "+";
    if (magnitude < 10) out->exponent.push_back('0');
    out->exponent += std::to_string(magnitude);
    return true;
  }
  if (n - 1 - exponent > kPrecision) {  // cut: the exact value, rounded
    r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::fixed,
                      kPrecision);
    std::string text(buf, r.ptr);
    const size_t point = text.find('.');
    out->whole = text.substr(0, point);
    out->fraction = text.substr(point + 1);
    TrimZeros(&out->fraction);
    return true;
  }
  if (exponent > n - 1) {
    // Zeros stand for digits of a value above 2^24 (float32): NumPy 1's
    // padded text shows its exact digits instead; NumPy formats it.
    double shortest = 0;
    std::from_chars(digits.data(), digits.data() + n, shortest);
    for (int i = n - 1; i < exponent; ++i) shortest *= 10;
    if (shortest != std::fabs(static_cast<double>(x))) return false;
  }
  if (exponent >= n - 1) {
    out->whole = sign + digits + std::string(exponent - (n - 1), '0');
    out->fraction.clear();
  } else if (exponent >= 0) {
    out->whole = sign + digits.substr(0, exponent + 1);
    out->fraction = digits.substr(exponent + 1);
  } else {
    out->whole = sign + "0";
    out->fraction = std::string(-exponent - 1, '0') + digits;
  }
  TrimZeros(&out->fraction);
  return true;
}

// `x` in scientific form with `precision` digits after the point: its
// exact value, rounded; false where the exponent is not the first text's.
template <typename T>
bool ExactScientific(T x, int precision, Parts* p) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x,
                         std::chars_format::scientific, precision);
  bool negative;
  std::string digits;
  int exponent;
  Split(buf, r.ptr, &negative, &digits, &exponent);
  const int magnitude = exponent < 0 ? -exponent : exponent;
  std::string e = exponent < 0 ? "-" : "+";
  if (magnitude < 10) e.push_back('0');
  e += std::to_string(magnitude);
  if (e != p->exponent) return false;
  p->whole = (negative ? "-" : "") + digits.substr(0, 1);
  p->fraction = digits.substr(1);
  return true;
}

// The words (one per element, padded) of a float array; false where NumPy
// formats it.
template <typename T>
bool FloatWords(const T* v, int64_t size, int flags,
                std::vector<std::string>* words) {
  bool any = false;
  T max_val = 0, min_val = 0;
  bool neginf = false, nonfinite = false;
  for (int64_t i = 0; i < size; ++i) {
    const T x = v[i];
    if (!std::isfinite(x)) {
      nonfinite = true;
      if (std::isinf(x) && x < 0) neginf = true;
      continue;
    }
    if (x == 0) continue;
    const T a = std::fabs(x);
    if (!any || a > max_val) max_val = a;
    if (!any || a < min_val) min_val = a;
    any = true;
  }
  bool scientific = false;
  if (any) {
    const T cutoff = (flags & kCutoffByDtype) && sizeof(T) == 4 ? 1e6f : 1e8f;
    const bool small = (flags & kCompareInDtype)
                           ? min_val < static_cast<T>(0.0001)
                           : static_cast<double>(min_val) < 0.0001;
    const volatile T ratio = max_val / min_val;  // in the dtype, as NumPy
    scientific = max_val >= cutoff || small || ratio > static_cast<T>(1000.);
  }
  std::vector<Parts> parts(static_cast<size_t>(size));
  size_t pad_left = 0, pad_right = 0, exp_size = 0;
  bool finite = false;
  for (int64_t i = 0; i < size; ++i) {
    if (!std::isfinite(v[i])) continue;
    Parts& p = parts[static_cast<size_t>(i)];
    if (!FirstText(v[i], scientific, &p)) return false;
    finite = true;
    pad_left = std::max(pad_left, p.whole.size());
    pad_right = std::max(pad_right, p.fraction.size());
    if (scientific) exp_size = std::max(exp_size, p.exponent.size() - 1);
  }
  const size_t precision = pad_right;  // scientific: every fraction's length
  if (finite && scientific) pad_right = exp_size + 2 + precision;
  if (nonfinite) {
    const size_t offset = pad_right + 1;
    const size_t need = 3 + (neginf ? 1 : 0);
    if (need > offset) pad_left = std::max(pad_left, need - offset);
  }
  words->resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    std::string& w = (*words)[static_cast<size_t>(i)];
    const T x = v[i];
    if (!std::isfinite(x)) {
      const char* s = std::isnan(x) ? "nan" : (x < 0 ? "-inf" : "inf");
      const size_t width = pad_left + pad_right + 1;
      w.assign(width > std::strlen(s) ? width - std::strlen(s) : 0, ' ');
      w += s;
      continue;
    }
    Parts& p = parts[static_cast<size_t>(i)];
    if (scientific && p.fraction.size() < precision) {
      // NumPy's min_digits: more digits of the exact value, rounded (not
      // zeros).
      if (!ExactScientific(x, static_cast<int>(precision), &p)) return false;
    }
    w.assign(pad_left - p.whole.size(), ' ');
    w += p.whole;
    w.push_back('.');
    w += p.fraction;
    if (scientific) {
      w.append(precision - p.fraction.size(), '0');
      w.push_back('e');
      w.push_back(p.exponent[0]);
      w.append(exp_size - (p.exponent.size() - 1), '0');
      w.append(p.exponent, 1, std::string::npos);
    } else {
      w.append(pad_right - p.fraction.size(), ' ');
    }
  }
  return true;
}

template <typename T>
void IntegerWords(const T* v, int64_t size, std::vector<std::string>* words) {
  words->resize(static_cast<size_t>(size));
  size_t width = 0;
  char buf[24];
  for (int64_t i = 0; i < size; ++i) {
    auto r = std::to_chars(buf, buf + sizeof(buf), v[i]);
    (*words)[static_cast<size_t>(i)].assign(buf, r.ptr);
    width = std::max(width, static_cast<size_t>(r.ptr - buf));
  }
  for (std::string& w : *words) w.insert(0, width - w.size(), ' ');
}

template <typename T>
std::vector<T> Values(const void* data, int64_t size) {
  std::vector<T> v(static_cast<size_t>(size));
  if (size) std::memcpy(v.data(), data, sizeof(T) * static_cast<size_t>(size));
  return v;
}

bool Words(int32_t dtype, int32_t rank, const void* data, int64_t size,
           int flags, std::vector<std::string>* words) {
  using xla::ffi::DataType;
  switch (static_cast<DataType>(dtype)) {
    case DataType::F32:
      return FloatWords(Values<float>(data, size).data(), size, flags, words);
    case DataType::F64:
      return FloatWords(Values<double>(data, size).data(), size, flags, words);
    case DataType::PRED: {
      words->clear();
      for (uint8_t b : Values<uint8_t>(data, size)) {
        words->push_back(b ? (rank == 0 ? "True" : " True") : "False");
      }
      return true;
    }
#define HOSTCB_INTEGER(code, type)                              \
  case DataType::code:                                          \
    IntegerWords(Values<type>(data, size).data(), size, words); \
    return true;
      HOSTCB_INTEGER(S8, int8_t)
      HOSTCB_INTEGER(S16, int16_t)
      HOSTCB_INTEGER(S32, int32_t)
      HOSTCB_INTEGER(S64, int64_t)
      HOSTCB_INTEGER(U8, uint8_t)
      HOSTCB_INTEGER(U16, uint16_t)
      HOSTCB_INTEGER(U32, uint32_t)
      HOSTCB_INTEGER(U64, uint64_t)
#undef HOSTCB_INTEGER
    default:
      return false;
  }
}

// NumPy's _extendLine (not NumPy 1.13's legacy).
void ExtendLine(std::string* s, std::string* line, const std::string& word,
                size_t width, size_t indent) {
  if (line->size() + word.size() > width && line->size() > indent) {
    size_t end = line->find_last_not_of(' ');
    s->append(*line, 0, end == std::string::npos ? 0 : end + 1);
    s->push_back('\n');
    line->assign(indent, ' ');
  }
  *line += word;
}

// NumPy's _formatArray's recurser, without summarization.
std::string Nest(const std::vector<std::string>& words, int32_t rank,
                 const int64_t* dims, int32_t axis, int64_t first,
                 size_t indent, size_t width) {
  if (axis == rank) return words[static_cast<size_t>(first)];
  int64_t stride = 1;
  for (int32_t a = axis + 1; a < rank; ++a) stride *= dims[a];
  const int64_t n = dims[axis];
  std::string s;
  if (axis == rank - 1) {
    const size_t elem_width = width - 1;
    std::string line(indent, ' ');
    for (int64_t i = 0; i < n; ++i) {
      ExtendLine(&s, &line, words[static_cast<size_t>(first + i)], elem_width,
                 indent);
      if (i + 1 < n) line.push_back(' ');
    }
    s += line;
  } else {
    const std::string sep(static_cast<size_t>(rank - axis - 1), '\n');
    for (int64_t i = 0; i < n; ++i) {
      s.append(indent, ' ');
      s += Nest(words, rank, dims, axis + 1, first + i * stride, indent + 1,
                width - 1);
      if (i + 1 < n) s += sep;
    }
  }
  return "[" + s.substr(indent) + "]";
}

}  // namespace

bool AppendArrayText(int32_t dtype, int32_t rank, const int64_t* dims,
                     const void* data, int flags, int64_t threshold,
                     std::string* out) {
  int64_t size = 1;
  for (int32_t a = 0; a < rank; ++a) size *= dims[a];
  if (size == 0) {
    out->append("[]");
    return true;
  }
  if (size > threshold) return false;  // summarized
  std::vector<std::string> words;
  if (!Words(dtype, rank, data, size, flags, &words)) return false;
  if (rank == 0) {
    *out += words[0];
    return true;
  }
  *out += Nest(words, rank, dims, 0, 0, 1, kLineWidth);
  return true;
}

#else  // HOSTCB_ARRAY_TEXT

bool AppendArrayText(int32_t, int32_t, const int64_t*, const void*, int,
                     int64_t, std::string*) {
  return false;
}

#endif  // HOSTCB_ARRAY_TEXT

// array_text(array, flags, threshold) -> str or None (module.cc).
PyObject* ArrayTextOf(PyObject* array, int flags, int64_t threshold) {
  if (!PyArray_CheckExact(array)) Py_RETURN_NONE;
  auto* a = reinterpret_cast<PyArrayObject*>(array);
  if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISNOTSWAPPED(a)) Py_RETURN_NONE;
  using xla::ffi::DataType;
  DataType dtype;
  switch (PyArray_TYPE(a)) {
    case NPY_FLOAT:
      dtype = DataType::F32;
      break;
    case NPY_DOUBLE:
      dtype = DataType::F64;
      break;
    case NPY_BOOL:
      dtype = DataType::PRED;
      break;
    case NPY_BYTE:
      dtype = DataType::S8;
      break;
    case NPY_SHORT:
      dtype = DataType::S16;
      break;
    case NPY_INT:
      dtype = DataType::S32;
      break;
    case NPY_LONG:
      dtype = sizeof(long) == 8 ? DataType::S64 : DataType::S32;
      break;
    case NPY_LONGLONG:
      dtype = DataType::S64;
      break;
    case NPY_UBYTE:
      dtype = DataType::U8;
      break;
    case NPY_USHORT:
      dtype = DataType::U16;
      break;
    case NPY_UINT:
      dtype = DataType::U32;
      break;
    case NPY_ULONG:
      dtype = sizeof(long) == 8 ? DataType::U64 : DataType::U32;
      break;
    case NPY_ULONGLONG:
      dtype = DataType::U64;
      break;
    default:
      Py_RETURN_NONE;
  }
  const int rank = PyArray_NDIM(a);
  std::vector<int64_t> dims(static_cast<size_t>(rank));
  for (int i = 0; i < rank; ++i) dims[i] = PyArray_DIMS(a)[i];
  std::string text;
  if (!AppendArrayText(static_cast<int32_t>(dtype), rank, dims.data(),
                       PyArray_DATA(a), flags, threshold, &text)) {
    Py_RETURN_NONE;
  }
  return PyUnicode_DecodeASCII(text.data(),
                               static_cast<Py_ssize_t>(text.size()), "strict");
}

}  // namespace hostcb
