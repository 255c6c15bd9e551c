/* FFPA_API: the symbols the ffpa shared library exports (everything else is
 * hidden). Shared by the C and the C++ headers. */
#ifndef FFPA_EXPORT_H
#define FFPA_EXPORT_H

#ifndef FFPA_API
#if defined(__GNUC__) || defined(__clang__)
#define FFPA_API __attribute__((visibility("default")))
#else
#define FFPA_API
#endif
#endif

#endif /* FFPA_EXPORT_H */
