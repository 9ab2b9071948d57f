/* The tests' HTTP client (harness.h): lib/httpc.c, failing the test when the exchange itself
 * fails. Loopback only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "harness.h"
#include "httpc.h"

int sp_test_http(int port, const char *method, const char *path, const char *key,
                 const char *extra_headers, const char *body, size_t body_len,
                 sp_test_http_resp_t *ret)
{
    sp_httpc_req_t req = {.host = "127.0.0.1",
                          .port = port,
                          .method = method,
                          .path = path,
                          .key = key,
                          .extra_headers = extra_headers,
                          .body = body,
                          .body_len = body_len};
    int rc = sp_httpc_do(&req, ret);
    if (rc < 0)
        fail_msg("http: %s %s: %s", method, path, sp_strerror(rc));
    return 0;
}

void sp_test_http_free(sp_test_http_resp_t *r)
{
    sp_httpc_resp_free(r);
}

int sp_test_http_header(const sp_test_http_resp_t *r, const char *name, char *out, size_t len)
{
    return sp_httpc_header(r, name, out, len) == 0 ? 0 : -1;
}

int sp_test_api_port(void)
{
    char host[64];
    int port = 0;
    const char *url = sp_test_env("SPACE_API_URL");
    if (sp_httpc_parse_url(url, host, sizeof(host), &port) < 0 || strcmp(host, "127.0.0.1") != 0)
        fail_msg("SPACE_API_URL %s is not a loopback URL", url);
    return port;
}
