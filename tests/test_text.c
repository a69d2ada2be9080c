/* The writers of fourfold's text files (src/util): JSON strings
 * (ff_text_json_string, the one escaper of the JSON writers: profiles,
 * traces, the training log) read back by the library's JSON reader to the
 * same bytes, and the loss plot's SVG (ff_plot_svg) with a title, axis
 * labels, legend names and a colour holding XML's special characters:
 * escaped, so the file stays well-formed (a scan of its markup) and shows
 * the text as given. Pure functions, no MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "util/json.h"
#include "util/plot.h"
#include "util/text.h"

static void test_json_strings(void)
{
    const char *cases[] = {"runs/x",
                           "a \"quoted\" name",
                           "back\\slash\\",
                           "tab\tnew\nline\r",
                           "\x01\x1f control",
                           "UTF-8 caf\xc3\xa9",
                           ""};
    int same = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        ff_text b = {0};
        ff_text_json_string(&b, cases[i], 0);
        char back[128] = "", err[256] = "";
        ff_json r;
        ff_json_init(&r, b.s, b.n, "test", "string", err, sizeof err);
        int rc = ff_json_string(&r, back, sizeof back);
        int ok = !b.failed && rc == 0 && !strcmp(back, cases[i]);
        same += ok;
        CHECK(ok, "JSON string %d: written %s, read back '%s' (%s)", i, b.s ? b.s : "(none)", back,
              err);
        ff_text_free(&b);
    }
    printf("JSON strings: %d of %d (quotes, backslashes, control characters, UTF-8) read back "
           "to the same bytes: %s\n",
           same, n, same == n ? "PASS" : "FAIL");
}

/* 1 if an entity (&amp; &lt; &gt; &quot; &apos; &#...;) starts at p. */
static int entity_at(const char *p)
{
    static const char *const names[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strncmp(p, names[i], strlen(names[i])))
            return 1;
    return 0;
}

/* The markup of an SVG file as this writer makes it (tags with quoted
 * attributes, character data between them): a '<' or '>' in text or in a
 * value, a '&' that starts no entity, or an unclosed tag or value fails.
 * Returns the offset of the first fault, or -1. */
static long markup_fault(const char *s)
{
    enum { TEXT, TAG, VALUE } state = TEXT;
    for (const char *p = s; *p; p++) {
        char c = *p;
        if (c == '&' && (state == TAG || !entity_at(p)))
            return p - s;
        if (state == TEXT && c == '<')
            state = TAG;
        else if (state == TAG && c == '"')
            state = VALUE;
        else if (state == VALUE && c == '"')
            state = TAG;
        else if (state == TAG && c == '>')
            state = TEXT;
        else if (c == '<' || c == '>' || (state == TAG && c == '\''))
            return p - s;
    }
    return state == TEXT ? -1 : (long)strlen(s);
}

static void test_svg_labels(void)
{
    char dir[] = "/tmp/ff_test_text_XXXXXX", path[64], err[256];
    CHECK(mkdtemp(dir) != NULL, "cannot create a folder under /tmp");
    snprintf(path, sizeof path, "%s/loss.svg", dir);
    const double x[3] = {1, 2, 3}, y[3] = {3, 2.5, 2};
    const char *title = "run <a> & \"b\" 'c'", *xlabel = "step & \x01time",
               *ylabel = "loss </text>";
    const ff_plot_series s[2] = {{"train <1> & \"x\"", "#1f77b4", x, y, 3, 0},
                                 {"val'", "red\" onload=\"x", x, y, 3, 1}};
    CHECK(ff_plot_svg(path, title, xlabel, ylabel, s, 2, err, sizeof err) == 0, "%s", err);
    FILE *f = fopen(path, "rb");
    static char svg[1 << 16];
    size_t n = f ? fread(svg, 1, sizeof svg - 1, f) : 0;
    svg[n] = '\0';
    if (f)
        fclose(f);
    long fault = markup_fault(svg);
    CHECK(n > 0 && fault < 0, "the SVG's markup breaks at byte %ld: ...%.40s", fault,
          fault >= 0 ? svg + (fault > 20 ? fault - 20 : 0) : "");
    const char *shown[] = {">run &lt;a&gt; &amp; &quot;b&quot; &apos;c&apos;</text>",
                           ">step &amp; ?time</text>",
                           ">loss &lt;/text&gt;</text>",
                           ">train &lt;1&gt; &amp; &quot;x&quot;</text>",
                           ">val&apos;</text>",
                           "stroke=\"red&quot; onload=&quot;x\""};
    int found = 0, m = (int)(sizeof shown / sizeof shown[0]);
    for (int i = 0; i < m; i++) {
        found += strstr(svg, shown[i]) != NULL;
        CHECK(strstr(svg, shown[i]), "the SVG lacks %s", shown[i]);
    }
    printf("SVG labels: markup well-formed (%s), %d of %d texts escaped as expected "
           "(& < > \" ' as entities, a control character as ?): %s\n",
           fault < 0 ? "no fault" : "FAULT", found, m, fault < 0 && found == m ? "PASS" : "FAIL");
    remove(path);
    rmdir(dir);
}

int main(void)
{
    test_json_strings();
    test_svg_labels();
    return test_finish("text_escape");
}
