/* clang-format off */
/* cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSPACE_FUZZ=ON && cmake --build build-fuzz --target fuzz && build-fuzz/bin/egress_fuzz -max_total_time=30 -max_len=2048 tests/fuzz/corpus/egress_fuzz */
/* clang-format on */
/* libFuzzer target for what space-egressd parses from guests (dns.h, egress_parse.h) and the
 * scrubber upstream bytes pass through on their way to the guest (redact.h). Built with
 * -DSPACE_FUZZ=ON (tests/fuzz/CMakeLists.txt); scripts/test.sh runs it for 30 s. The first input
 * byte picks the parser; the rest is the guest's bytes.
 *
 * Beyond "no crash, no leak, no undefined behaviour" it checks the contract:
 * - the answer built for a parsed DNS query parses back with the same name and id;
 * - a parsed ClientHello's SNI is empty or a valid DNS name;
 * - a parsed HTTP head has head_len <= input length and a valid Host;
 * - the mask scrubber, fed the stream in pieces the input chooses (with a stall release in
 *   between when it says so), outputs exactly as many bytes as it was fed, holds back fewer
 *   than the longest value, and never outputs a value whole. Without releases its output is
 *   the one-shot scan's. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dns.h"
#include "egress_parse.h"
#include "netpolicy.h"
#include "redact.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t which = data[0] % 5;
    data++;
    size--;
    if (which == 0) {
        sp_dns_query_t q;
        if (sp_dns_parse_query(data, size, &q) == 0) {
            uint8_t r[SP_DNS_MSG_MAX];
            sp_dns_a_t a = {.addr_be = 0x01020304, .ttl = 5};
            size_t n = sp_dns_build_response(r, sizeof(r), &q, SP_DNS_NOERROR, &a, 1, 300);
            sp_dns_a_t back[2];
            size_t got = 0;
            int rcode;
            if (n && q.qclass == SP_DNS_CLASS_IN &&
                sp_dns_parse_response(r, n, q.id, q.name, back, 2, &got, &rcode) != 0)
                abort();
        }
    } else if (which == 1) {
        sp_dns_a_t a[8];
        size_t got = 0;
        int rcode;
        (void)sp_dns_parse_response(data, size,
                                    size >= 2 ? (uint16_t)((data[0] << 8) | data[1]) : 0,
                                    "www.example.com", a, 8, &got, &rcode);
        if (got > 8)
            abort();
    } else if (which == 2) {
        sp_tls_hello_t h;
        if (sp_tls_client_hello(data, size, &h) == SP_PARSE_OK && h.sni[0] &&
            !sp_dns_name_valid(h.sni, false))
            abort();
    } else if (which == 4) {
        /* Two values (8..39 bytes) from the input's start, then the stream; each stream byte
         * below 8 ends a feed there, a 0 also releases (a stall). */
        if (size < 2)
            return 0;
        size_t l1 = 8 + data[0] % 32, l2 = 8 + data[1] % 32;
        data += 2;
        size -= 2;
        if (size < l1 + l2)
            return 0;
        /* No '*' in a value: masks next to each other could spell one. */
        uint8_t v1[40], v2[40];
        memcpy(v1, data, l1);
        memcpy(v2, data + l1, l2);
        for (size_t i = 0; i < l1; i++)
            v1[i] = v1[i] == '*' ? '+' : v1[i];
        for (size_t i = 0; i < l2; i++)
            v2[i] = v2[i] == '*' ? '+' : v2[i];
        data += l1 + l2;
        size -= l1 + l2;
        sp_redactor_t *r = sp_redactor_new_mask('*', 8), *one = sp_redactor_new_mask('*', 8);
        (void)sp_redactor_add(r, "a", v1, l1);
        (void)sp_redactor_add(r, "b", v2, l2);
        (void)sp_redactor_add(one, "a", v1, l1);
        (void)sp_redactor_add(one, "b", v2, l2);
        size_t longest = l1 > l2 ? l1 : l2;
        sp_buf_t out, want;
        sp_buf_init(&out);
        sp_buf_init(&want);
        bool released = false;
        size_t at = 0;
        for (size_t i = 0; i < size; i++) {
            if (data[i] >= 8 && i + 1 < size)
                continue;
            sp_redactor_feed(r, data + at, i + 1 - at, &out);
            at = i + 1;
            if (sp_redactor_held(r) >= longest)
                abort();
            if (data[i] == 0) {
                sp_redactor_release(r, &out);
                released = true;
            }
        }
        sp_redactor_flush(r, &out);
        sp_redactor_feed(one, data, size, &want);
        sp_redactor_flush(one, &want);
        if (out.len != size || want.len != size || sp_redactor_held(r) != 0)
            abort();
        if (size && !released && memcmp(out.data, want.data, size) != 0)
            abort();
        if (size && (memmem(out.data, out.len, v1, l1) || memmem(out.data, out.len, v2, l2) ||
                     memmem(want.data, want.len, v1, l1) || memmem(want.data, want.len, v2, l2)))
            abort();
        sp_buf_dispose(&out);
        sp_buf_dispose(&want);
        sp_redactor_free(r);
        sp_redactor_free(one);
    } else {
        sp_http_head_t h;
        const char *why = NULL;
        if (sp_http_request_head(data, size, &h, &why) == SP_PARSE_OK &&
            (h.head_len > size || !sp_dns_name_valid(h.host, false)))
            abort();
    }
    return 0;
}
