/* test-status.c - status messages and the version string. */
#include "config.h"

#include "starinfer.h"
#include "test.h"

#include <string.h>

int main(void)
{
    static const int codes[] = {
#define CODE_(name, value, msg) value,
        SI_STATUS_LIST(CODE_)
#undef CODE_
    };
    const int n = (int)(sizeof codes / sizeof codes[0]);
    CHECK(codes[0] == SI_OK && SI_OK == 0, "SI_OK must be 0");
    for (int i = 0; i < n; i++) {
        const char *m = si_status_str(codes[i]);
        CHECK(m != NULL && strcmp(m, "unknown status") != 0, "status %d has no message", codes[i]);
        CHECK(i == 0 || codes[i] < 0, "failure status %d is not negative", codes[i]);
        for (int j = 0; j < i; j++) {
            CHECK(codes[i] != codes[j], "status value %d used twice", codes[i]);
            CHECK(strcmp(m, si_status_str(codes[j])) != 0, "message '%s' used twice", m);
        }
    }
    CHECK(strcmp(si_status_str(12345), "unknown status") == 0, "unknown codes have a message");
    CHECK(strcmp(si_version(), PACKAGE_VERSION) == 0, "si_version() %s != configure's %s",
          si_version(), PACKAGE_VERSION);
    return test_result();
}
