/* CRC-32 (IEEE 802.3, the polynomial of zlib and gzip), for the checksums of
 * checkpoint files. Incremental: crc = ff_crc32(crc, buf, len), starting
 * from 0. */
#ifndef FF_UTIL_CRC32_H
#define FF_UTIL_CRC32_H

#include <stddef.h>
#include <stdint.h>

uint32_t ff_crc32(uint32_t crc, const void *buf, size_t len);

#endif
