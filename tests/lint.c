/* tests/lint.c: the repository's style check (make lint: the lesson file's size and comments) and the header's section map.
 * Included by test.c, in place: one compile, one binary (see test.c). */
/* The teaching file's size (an aim of the project): kvtransformer.cu under 2,400
 * lines, at least a quarter of them comment lines. A comment line is one
 * inside a block comment, or one whose first non-blank characters open a
 * comment; a line of code with a comment after it counts as code. The tuned
 * CPU and GPU loops and the harness live in cpu/, gpu/, cli/ and bench/ (README, Reading
 * order), so growth here is a choice to look at, not an accident. It is the
 * repository's style check (`make lint`, run by CI), not a test: a student's
 * correct exercise solution may grow the file past the line, and make test
 * must still pass. make test checks only the counter itself. */
static void count_comment_lines(const char *text, int *lines, int *comments) {
    int in_block = 0;
    *lines = *comments = 0;
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n'), *s = p;
        if (!end) end = p + strlen(p);
        while (s < end && (*s == ' ' || *s == '\t')) s++;
        int opens = !in_block && end - s >= 2 && s[0] == '/' && s[1] == '*';
        int is_comment = in_block || opens || (end - s >= 2 && s[0] == '/' && s[1] == '/');
        if (opens || in_block) { /* a block comment from s (past its opening): does it close here? */
            const char *c = opens ? s + 2 : s;
            while (c + 1 < end && !(c[0] == '*' && c[1] == '/')) c++;
            in_block = !(c + 1 < end);
        }
        (*lines)++;
        *comments += is_comment;
        p = *end ? end + 1 : end;
    }
}
static void test_comment_counter(void) { /* on a hand-counted text: 5 lines, 3 of them comment lines */
    int tl, tc;
    count_comment_lines("int a; /* code */\n/* one\n * two */\n  // three\nint b;\n", &tl, &tc);
    expect(tl == 5 && tc == 3, "comment-line counter on a 5-line text with 3 comment lines: %d lines, %d comment", tl, tc);
}
static void lint_teaching_file_size(void) {
    size_t n = 0;
    char *cu = read_all("kvtransformer.cu", &n);
    if (!cu) { expect(0, "teaching file: kvtransformer.cu readable from the current directory"); return; }
    int lines, comments;
    count_comment_lines(cu, &lines, &comments);
    expect(lines < 2400 && 4 * comments >= lines, "teaching file: kvtransformer.cu has %d lines (< 2400), %d comment "
           "lines (%.1f%%, >= 25%%)", lines, comments, 100.0 * comments / lines);
    free(cu);
}

/* The map a reader finds the ops by: `grep -n "// §" kvtransformer.cu` lists
 * §1 .. §20 once each, in order (a section whose body moved to cli/ or bench/
 * keeps its banner line in the .cu), the file's opening comment names each
 * one, and README.md's reading order has a row for each. */
#define KVT_SECTIONS 20
static void test_section_map(void) {
    size_t n_cu = 0, n_md = 0;
    char *cu = read_all("kvtransformer.cu", &n_cu), *md = read_all("README.md", &n_md);
    if (!cu || !md) {
        expect(0, "section map: kvtransformer.cu and README.md readable from the current directory");
        free(cu);
        free(md);
        return;
    }
    int order[64], n = 0, banner_ok = 1, readme_ok = 1, missing = 0;
    for (const char *p = cu; (p = strstr(p, "\n// §")) != NULL; p++) /* section banners, at line starts */
        if (n < 64) order[n++] = atoi(p + strlen("\n// §"));
    int in_order = n == KVT_SECTIONS;
    for (int i = 0; i < n && in_order; i++) in_order = order[i] == i + 1;
    const char *banner_end = strstr(cu, "*/"); /* the opening comment */
    const char *rd = strstr(md, "## Reading order"), *rd_end = rd ? strstr(rd + 1, "\n## ") : NULL;
    for (int s = 1; s <= KVT_SECTIONS; s++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "§%d ", s); /* "§1 " is not a prefix of "§12 " */
        const char *b = strstr(cu, tag);
        if (!b || !banner_end || b > banner_end) { banner_ok = 0; missing = s; }
        /* a row of the reading order: "| 15 |", or s in a list "| 8, 13, 14, 7 |" */
        int row = 0;
        for (const char *q = rd; q && q < rd_end && (q = strstr(q, "\n| ")) != NULL && q < rd_end; q++) {
            const char *c = q + 3, *cell_end = strchr(c, '|');
            while (cell_end && c < cell_end) {
                char *next;
                long v = strtol(c, &next, 10);
                if (next == c) break;
                row |= v == s;
                c = next;
                while (c < cell_end && (*c == ',' || *c == ' ')) c++;
            }
        }
        if (!row) { readme_ok = 0; missing = s; }
    }
    expect(in_order, "section map: kvtransformer.cu has the banner lines §1 .. §%d once each, in order (found %d)",
           KVT_SECTIONS, n);
    char miss[32] = "none";
    if (missing) snprintf(miss, sizeof(miss), "§%d", missing);
    expect(banner_ok && readme_ok, "section map: the file's opening comment and README.md's reading order name "
           "every section (missing: %s)", miss);
    free(cu);
    free(md);
}
