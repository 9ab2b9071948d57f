/* UUIDv7 event ids, sandbox ids and clocks. */
#include "ids.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "hash.h"

#define RAND_B_MAX ((UINT64_C(1) << 62) - 1)
#define RAND_A_MAX 0xfff

/* Generator state, under uuid_lock. The 74 bits after the timestamp (12-bit rand_a, 62-bit
 * rand_b) form one counter (RFC 9562 section 6.2, method 1): seeded randomly when the
 * millisecond changes, incremented within a millisecond. The seed leaves the counter's top bit
 * clear so at least 2^73 ids fit in one millisecond before it rolls over. */
static pthread_mutex_t uuid_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t uuid_once = PTHREAD_ONCE_INIT;
static int64_t uuid_last_ms = -1;
static uint16_t uuid_rand_a;
static uint64_t uuid_rand_b;

/* The kernel's CSPRNG is the only randomness source; without it ids could collide across hosts,
 * so its absence stops the process like out of memory does. */
void sp_random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "space: getrandom: %s\n", strerror(errno));
            abort();
        }
        p += n;
        len -= (size_t)n;
    }
}

/* A forked child must not continue the parent's counter: both would hand out the same ids in
 * the same millisecond. The child reseeds on its next id; holding the lock across fork keeps
 * the child from inheriting a mutex locked by a thread that does not exist there. */
static void uuid_atfork_prepare(void)
{
    pthread_mutex_lock(&uuid_lock);
}

static void uuid_atfork_parent(void)
{
    pthread_mutex_unlock(&uuid_lock);
}

static void uuid_atfork_child(void)
{
    uuid_last_ms = -1;
    pthread_mutex_unlock(&uuid_lock);
}

static void uuid_register_atfork(void)
{
    pthread_atfork(uuid_atfork_prepare, uuid_atfork_parent, uuid_atfork_child);
}

static void uuid_seed(void)
{
    uint8_t r[10];

    sp_random_bytes(r, sizeof(r));
    uuid_rand_a = (uint16_t)(((r[0] << 8) | r[1]) & (RAND_A_MAX >> 1));
    uuid_rand_b = 0;
    for (size_t i = 2; i < sizeof(r); i++)
        uuid_rand_b = uuid_rand_b << 8 | r[i];
    uuid_rand_b &= RAND_B_MAX;
}

void sp_uuid7(uint8_t out[16])
{
    struct timespec ts;
    int64_t now_ms, ms;
    uint16_t a;
    uint64_t b;

    pthread_once(&uuid_once, uuid_register_atfork);
    clock_gettime(CLOCK_REALTIME, &ts);
    now_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;

    pthread_mutex_lock(&uuid_lock);
    if (now_ms > uuid_last_ms) {
        uuid_last_ms = now_ms;
        uuid_seed();
    } else if (uuid_rand_b < RAND_B_MAX) {
        /* Same millisecond, or the clock stepped back: stay on the last timestamp and count,
         * so ids keep increasing. */
        uuid_rand_b++;
    } else if (uuid_rand_a < RAND_A_MAX) {
        uuid_rand_b = 0;
        uuid_rand_a++;
    } else {
        /* Counter exhausted: borrow the next millisecond (RFC 9562 section 6.2 allows the
         * timestamp to run ahead rather than break ordering). */
        uuid_last_ms++;
        uuid_seed();
    }
    ms = uuid_last_ms;
    a = uuid_rand_a;
    b = uuid_rand_b;
    pthread_mutex_unlock(&uuid_lock);

    /* RFC 9562 section 5.7: unix_ts_ms(48) ver(4) rand_a(12) var(2) rand_b(62), big-endian. */
    for (int i = 0; i < 6; i++)
        out[i] = (uint8_t)((uint64_t)ms >> (40 - 8 * i));
    out[6] = (uint8_t)(0x70 | (a >> 8));
    out[7] = (uint8_t)a;
    out[8] = (uint8_t)(0x80 | (b >> 56));
    for (int i = 9; i < 16; i++)
        out[i] = (uint8_t)(b >> (8 * (15 - i)));
}

void sp_uuid_format(const uint8_t uuid[16], char out[SP_UUID_STR_LEN + 1])
{
    /* 8-4-4-4-12 hex digits: byte groups of 4, 2, 2, 2 and 6. */
    static const int groups[] = {4, 2, 2, 2, 6};
    char *p = out;
    int at = 0;

    for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
        if (g)
            *p++ = '-';
        sp_hex_encode(uuid + at, (size_t)groups[g], p);
        p += 2 * groups[g];
        at += groups[g];
    }
}

void sp_uuid7_str(char out[SP_UUID_STR_LEN + 1])
{
    uint8_t uuid[16];

    sp_uuid7(uuid);
    sp_uuid_format(uuid, out);
}

static bool is_hyphen_pos(int i)
{
    return i == 8 || i == 13 || i == 18 || i == 23;
}

int sp_uuid_parse(const char *s, uint8_t out[16])
{
    char digits[33];
    size_t n = 0;

    if (!s)
        return -EINVAL;
    /* Stops at a NUL too: '\0' is neither a hyphen nor kept as a digit. */
    for (int i = 0; i < SP_UUID_STR_LEN; i++) {
        if (is_hyphen_pos(i) != (s[i] == '-') || s[i] == '\0')
            return -EINVAL;
        if (s[i] != '-')
            digits[n++] = s[i];
    }
    if (s[SP_UUID_STR_LEN] != '\0' || n != 32)
        return -EINVAL;
    digits[n] = '\0';
    return sp_hex_decode(digits, out, 16) < 0 ? -EINVAL : 0;
}

int sp_uuid7_time_ms(const uint8_t uuid[16], int64_t *ret_ms)
{
    uint64_t ms = 0;

    if ((uuid[6] >> 4) != 7 || (uuid[8] & 0xc0) != 0x80)
        return -EINVAL;
    for (int i = 0; i < 6; i++)
        ms = ms << 8 | uuid[i];
    *ret_ms = (int64_t)ms;
    return 0;
}

void sp_sandbox_id_new(char out[SP_SANDBOX_ID_LEN + 1])
{
    /* RFC 4648 section 7, "base32hex": its alphabet is in ASCII order, so the text sorts like
     * the UUIDv7 bits it encodes (the section 6 alphabet puts '2'..'7' after 'z' by value but
     * before 'a' in ASCII). */
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuv";
    uint8_t uuid[16];

    sp_uuid7(uuid);
    memcpy(out, "sbx_", 4);
    /* 128 bits in 26 groups of 5; the last group holds 3 bits and 2 zero pad bits. */
    for (int g = 0; g < 26; g++) {
        int bit = g * 5;
        unsigned v = 0;
        for (int k = 0; k < 5; k++, bit++) {
            v <<= 1;
            if (bit < 128)
                v |= (uuid[bit / 8] >> (7 - bit % 8)) & 1;
        }
        out[4 + g] = alphabet[v];
    }
    out[SP_SANDBOX_ID_LEN] = '\0';
}

int sp_id_valid(const char *s)
{
    size_t i;

    if (!s)
        return 0;
    for (i = 0; s[i]; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (i >= 64)
            return 0;
        /* The first character is alphanumeric: "_" alone is the "not placed yet" subject token
         * and a leading '-' would read as an option to runsc and other tools. */
        if (!alnum && (i == 0 || (c != '_' && c != '-')))
            return 0;
    }
    return i > 0;
}

int64_t sp_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t sp_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
