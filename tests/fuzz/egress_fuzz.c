/* clang-format off */
/* cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSPACE_FUZZ=ON && cmake --build build-fuzz --target fuzz && build-fuzz/bin/egress_fuzz -max_total_time=30 -max_len=2048 tests/fuzz/corpus/egress_fuzz */
/* clang-format on */
/* libFuzzer target for what space-egressd parses from guests (dns.h, egress_parse.h). Built with
 * -DSPACE_FUZZ=ON (tests/fuzz/CMakeLists.txt); scripts/test.sh runs it for 30 s. The first input
 * byte picks the parser; the rest is the guest's bytes.
 *
 * Beyond "no crash, no leak, no undefined behaviour" it checks the contract:
 * - the answer built for a parsed DNS query parses back with the same name and id;
 * - a parsed ClientHello's SNI is empty or a valid DNS name;
 * - a parsed HTTP head has head_len <= input length and a valid Host. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dns.h"
#include "egress_parse.h"
#include "netpolicy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t which = data[0] % 4;
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
    } else {
        sp_http_head_t h;
        const char *why = NULL;
        if (sp_http_request_head(data, size, &h, &why) == SP_PARSE_OK &&
            (h.head_len > size || !sp_dns_name_valid(h.host, false)))
            abort();
    }
    return 0;
}
