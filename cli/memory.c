/* kvtransformer.cu, end of §3: how many bytes of host memory the checks
 * before the big allocations may count on (kvt_mem_check), included by
 * kvtransformer.cu in its place. */
/* Available bytes: KVT_MEM_LIMIT (a whole number of bytes, at least 1) when
 * set, so tests can act out a small machine; else MemAvailable of
 * /proc/meminfo (free memory plus the caches the kernel can drop); 0 when
 * neither is known: checks are skipped. A KVT_MEM_LIMIT that is not such a
 * number ("1e3", "-1000", "0", one past 2^64) is an error, not "no limit". */
static kvt_status kvt_mem_available(size_t *avail, const char **source) {
    const char *env = getenv("KVT_MEM_LIMIT");
    *avail = 0;
    if (env && *env) {
        size_t v = 0;
        int ok = 1;
        for (const char *c = env; *c && ok; c++) {
            ok = *c >= '0' && *c <= '9' && v <= (SIZE_MAX - (size_t)(*c - '0')) / 10;
            v = v * 10 + (size_t)(*c - '0');
        }
        if (!ok || v == 0)
            return kvt_fail(KVT_EARG, "KVT_MEM_LIMIT '%s': expected a whole number of bytes in [1, %zu] (digits only)",
                            env, (size_t)SIZE_MAX);
        *source = "KVT_MEM_LIMIT";
        *avail = v;
        return KVT_OK;
    }
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return KVT_OK;
    char line[256];
    unsigned long long kb = 0;
    int found = 0;
    while (!found && fgets(line, sizeof(line), f)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(f);
    *source = "MemAvailable in /proc/meminfo";
    *avail = found ? (size_t)kb * 1024 : 0;
    return KVT_OK;
}
