/* GPT-2's byte-level BPE (include/fourfold/bpe.h) on a vocabulary the test
 * writes itself: 256 byte tokens (id 255 - b for the byte b, so ids are not
 * bytes) and a few merges, in GPT-2's file formats. Expected encodings are
 * derived by hand from GPT-2's pattern and encoder.py's loop (comments
 * below), and 3000 random words are compared with encoder.py's loop written
 * out literally; then round trips of random bytes, the word cache past its
 * size, llm.c's gpt2_tokenizer.bin, and malformed files, each refused with
 * its code and a message naming the problem. With GPT-2's own files
 * (scripts/setup.sh gpt2-vocab), a few published facts; "skipped" without.
 * No MPI. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fourfold/bpe.h"
#include "test_util.h"

static char dir[4096];

/* ---- the vocabulary the test writes ---------------------------------------------------- */

/* encoder.py's bytes_to_unicode, as UTF-8: the printable bytes stand for
 * themselves, the other 68 for U+0100 onwards in byte order. */
static void byte_char(int b, char out[3])
{
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = b, n = 0;
    if (!printable)
        for (int c = 0; c < b; c++)
            n += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255));
    if (!printable)
        cp = 256 + n;
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
    }
}

/* The merges in rank order: left, right as bytes (the test turns them into
 * GPT-2's characters); the merged token gets the id 256 + its rank. "xy x"
 * comes before "x y" on purpose: a pair that only a later merge can make
 * has a lower rank (encoder.py still merges "x y" everywhere first). */
static const struct {
    const char *left, *right;
} merges[] = {
    {"h", "e"}, {"l", "l"},   {"he", "ll"},     {"hell", "o"}, {"xy", "x"},
    {" ", "w"}, {"a", "a"},   {"aa", "aa"},     {"b", "c"},    {"a", "b"},
    {"x", "y"}, {"'", "t"},   {"\xc3", "\xbc"}, {"\xff", "!"}, {" ", "\xff"},
    {" ", " "}, {"\n", "\n"}, {"!", "\xc2"},    {"!", "\xef"},
};
enum { NMERGES = sizeof merges / sizeof merges[0], EOT = 256 + NMERGES, VOCAB = EOT + 1 };

/* the token of one byte */
static int32_t T(int byte) { return 255 - (unsigned char)byte; }
/* the token a merge makes, by its bytes */
static int32_t M(const char *bytes)
{
    for (int i = 0; i < NMERGES; i++) {
        char s[16];
        snprintf(s, sizeof s, "%s%s", merges[i].left, merges[i].right);
        if (!strcmp(s, bytes))
            return 256 + i;
    }
    fprintf(stderr, "test bug: no merge makes '%s'\n", bytes);
    exit(2);
}

/* bytes in GPT-2's characters */
static void to_chars(const char *bytes, char *out)
{
    out[0] = 0;
    for (const unsigned char *p = (const unsigned char *)bytes; *p; p++) {
        char c[3];
        byte_char(*p, c);
        strcat(out, c);
    }
}

static void write_text(const char *name, const char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text) || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

/* encoder.json: every byte's token (some keys as \u escapes, as OpenAI's
 * file has them, some as UTF-8), the merged tokens, <|endoftext|> */
static char *encoder_json(void)
{
    char *j = malloc(1 << 16);
    strcpy(j, "{");
    for (int b = 0; b < 256; b++) {
        char c[3], key[16];
        byte_char(b, c);
        if ((unsigned char)c[0] >= 0x80 && b % 2) /* an escape: \u0120 */
            snprintf(key, sizeof key, "\\u%04x",
                     ((unsigned char)c[0] & 0x1f) << 6 | ((unsigned char)c[1] & 0x3f));
        else if (c[0] == '"' || c[0] == '\\')
            snprintf(key, sizeof key, "\\%c", c[0]);
        else
            snprintf(key, sizeof key, "%s", c);
        sprintf(j + strlen(j), "%s\"%s\": %d", b ? ", " : "", key, (int)T(b));
    }
    for (int i = 0; i < NMERGES; i++) {
        char both[16], chars[64];
        snprintf(both, sizeof both, "%s%s", merges[i].left, merges[i].right);
        to_chars(both, chars);
        sprintf(j + strlen(j), ",\n \"%s\": %d", chars, 256 + i);
    }
    sprintf(j + strlen(j), ", \"<|endoftext|>\": %d}\n", EOT);
    return j;
}

static char *vocab_bpe(void)
{
    char *v = malloc(1 << 14);
    strcpy(v, "#version: 0.2\n");
    for (int i = 0; i < NMERGES; i++) {
        char l[64], r[64];
        to_chars(merges[i].left, l);
        to_chars(merges[i].right, r);
        sprintf(v + strlen(v), "%s %s\n", l, r);
    }
    return v;
}

/* ---- encoder.py's loop, literally ------------------------------------------------------ */

/* each merge's (left, right) as token ids, worked out once */
static int32_t merge_left[NMERGES], merge_right[NMERGES];

static void ref_init(void)
{
    for (int i = 0; i < NMERGES; i++) {
        const char *l = merges[i].left, *r = merges[i].right;
        merge_left[i] = strlen(l) == 1 ? T(l[0]) : M(l);
        merge_right[i] = strlen(r) == 1 ? T(r[0]) : M(r);
    }
}

static int ref_rank(int32_t a, int32_t b, int32_t *merged)
{
    for (int i = 0; i < NMERGES; i++)
        if (merge_left[i] == a && merge_right[i] == b) {
            *merged = 256 + i;
            return i;
        }
    return -1;
}

/* while True: the pair of lowest rank; none: stop; merge all its
 * occurrences left to right */
static size_t ref_bpe(const unsigned char *w, size_t m, int32_t *out)
{
    int32_t *part = malloc(m * sizeof *part), *next = malloc(m * sizeof *next);
    size_t n = m;
    for (size_t i = 0; i < m; i++)
        part[i] = T(w[i]);
    for (;;) {
        int best = -1;
        int32_t a = 0, b = 0, merged = 0, mm;
        for (size_t i = 0; i + 1 < n; i++) {
            int r = ref_rank(part[i], part[i + 1], &mm);
            if (r >= 0 && (best < 0 || r < best))
                best = r, a = part[i], b = part[i + 1], merged = mm;
        }
        if (best < 0)
            break;
        size_t k = 0;
        for (size_t i = 0; i < n;) {
            if (i + 1 < n && part[i] == a && part[i + 1] == b)
                next[k++] = merged, i += 2;
            else
                next[k++] = part[i++];
        }
        memcpy(part, next, k * sizeof *part);
        n = k;
    }
    memcpy(out, part, n * sizeof *out);
    free(part);
    free(next);
    return n;
}

/* ---- checks ------------------------------------------------------------------------------ */

static int32_t toks[1 << 20];

static void expect(ff_bpe *b, const char *what, const char *text, size_t len, const int32_t *want,
                   size_t nwant)
{
    size_t n = 0;
    int rc = ff_bpe_encode(b, text, len, toks, &n);
    int same = rc == FF_OK && n == nwant && (n == 0 || !memcmp(toks, want, n * sizeof *want));
    char got[512] = "", exp[512] = "";
    for (size_t i = 0; i < n && i < 24; i++)
        sprintf(got + strlen(got), " %d", (int)toks[i]);
    for (size_t i = 0; i < nwant && i < 24; i++)
        sprintf(exp + strlen(exp), " %d", (int)want[i]);
    CHECK(same, "%s: tokens [%s ], want [%s ] (rc %d)", what, got, exp, rc);
    char *back = NULL;
    size_t blen = 0;
    int drc = ff_bpe_decode(b, toks, n, &back, &blen);
    CHECK(drc == FF_OK && blen == len && !memcmp(back, text, len), "%s: decode differs", what);
    free(back);
    if (same)
        printf("ok  %-58s ->%s\n", what, got);
}

#define EXPECT(b, what, text, ...)                                                                 \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect(b, what, text, sizeof(text) - 1, want_, sizeof want_ / sizeof want_[0]);            \
    } while (0)

static void hand_derived(ff_bpe *b)
{
    size_t n = 9;
    CHECK(ff_bpe_encode(b, "", 0, toks, &n) == FF_OK && n == 0, "empty text: %zu tokens", n);
    printf("ok  %-58s -> (none)\n", "the empty text");
    /* h e l l o: (h,e) rank 0, then (l,l) 1, (he,ll) 2, (hell,o) 3 */
    EXPECT(b, "hello: merges by rank", "hello", M("hello"));
    /* words "hello", " world"; (" ",w) rank 5, nothing else in " world" */
    EXPECT(b, "hello world: the pattern's words", "hello world", M("hello"), M(" w"), T('o'),
           T('r'), T('l'), T('d'));
    /* (a,a) at 0,1,2,3: merged left to right at 0 and 2, then (aa,aa) */
    EXPECT(b, "aaaaa: ties left to right", "aaaaa", M("aaaa"), T('a'));
    EXPECT(b, "aaa", "aaa", M("aa"), T('a'));
    /* (b,c) rank 8 before (a,b) rank 9, though (a,b) is leftmost */
    EXPECT(b, "abc: the lower rank first, not the leftmost", "abc", T('a'), M("bc"));
    /* (x,y) rank 10 everywhere first, then (xy,xy) has no rank; the lower
     * ranked (xy,x) would apply only if merged before the round ends */
    EXPECT(b, "xyxy: a merge's every occurrence in one round", "xyxy", M("xy"), M("xy"));
    EXPECT(b, "xyx: a later pair of lower rank", "xyx", M("xyx"));
    /* contractions: "don", "'t"; upper case is not one: "DON", "'", "T" */
    EXPECT(b, "don't: 't is a word", "don't", T('d'), T('o'), T('n'), M("'t"));
    EXPECT(b, "DON'T: 'T is not", "DON'T", T('D'), T('O'), T('N'), T('\''), T('T'));
    EXPECT(b, "x 't: \" '\" and \"t\"", "x 't", T('x'), T(' '), T('\''), T('t'));
    /* "a", " ", " b": the space before a letter goes with it */
    EXPECT(b, "a  b: spaces split before the last", "a  b", T('a'), T(' '), T(' '), T('b'));
    EXPECT(b, "a   b", "a   b", T('a'), M("  "), T(' '), T('b'));
    /* "\n\n" before a letter: \s+(?!\S) takes the first "\n" only (the
     * second is followed by a letter), \s+ the second: no (\n,\n) merge */
    EXPECT(b, "a\\n\\nb: a newline run splits before the last", "a\n\nb", T('a'), T('\n'), T('\n'),
           T('b'));
    /* "a", " \n\n" (the run up to its last space), " b" */
    EXPECT(b, "a \\n\\n b", "a \n\n b", T('a'), T(' '), M("\n\n"), T(' '), T('b'));
    EXPECT(b, "a  : trailing spaces one word", "a  ", T('a'), M("  "));
    /* U+00FC is a letter: one word; its bytes C3 BC merge */
    EXPECT(b, "Zürich: a letter's bytes merge", "Z\xc3\xbcrich", T('Z'), M("\xc3\xbc"), T('r'),
           T('i'), T('c'), T('h'));
    EXPECT(b, "ab12: letters, then digits", "ab12", M("ab"), T('1'), T('2'));
    /* bytes no merge mentions stay byte tokens */
    EXPECT(b, "\\x01\\x7f: unknown bytes", "\x01\x7f", T(1), T(0x7f));
    /* "<|", "endoftext", "|>": ordinary text, not the end-of-text token */
    EXPECT(b, "<|endoftext|> in the text is text", "<|endoftext|>", T('<'), T('|'), T('e'), T('n'),
           T('d'), T('o'), T('f'), T('t'), T('e'), T('x'), T('t'), T('|'), T('>'));
    /* invalid UTF-8: each bad byte a character that is no letter, digit
     * or space, so 0xFF joins the '!' after it, and the space before it */
    EXPECT(b, "a\\xff!: an invalid byte groups with punctuation", "a\xff!", T('a'), M("\xff!"));
    EXPECT(b, "\" \\xff\": and takes the space before it", " \xff", M(" \xff"));
    EXPECT(b, "\\xffab: but not letters",
           "\xff"
           "ab",
           T(0xff), M("ab"));
    EXPECT(b, "ü\\xff!: valid, then invalid", "\xc3\xbc\xff!", M("\xc3\xbc"), M("\xff!"));
    EXPECT(b, "Z\\xc3: a cut sequence", "Z\xc3", T('Z'), T(0xc3));
    EXPECT(b, "\\xc0\\xaf: an overlong '/'", "\xc0\xaf", T(0xc0), T(0xaf));
    EXPECT(b, "\\xed\\xa0\\x80: a surrogate", "\xed\xa0\x80!", T(0xed), T(0xa0), T(0x80), T('!'));
    /* U+0085 is White_Space (GPT-2's \s): "!", NEL, "!", so (!,C2) does
     * not apply; U+FEFF is not: one word "!" BOM "!", (!,EF) applies */
    EXPECT(b, "!NEL!: U+0085 is a space", "!\xc2\x85!", T('!'), T(0xc2), T(0x85), T('!'));
    EXPECT(b, "!BOM!: U+FEFF is not", "!\xef\xbb\xbf!", M("!\xef"), T(0xbb), T(0xbf), T('!'));
    /* 100001 letters: one word, merged in O(n log n) */
    size_t len = 100001;
    char *a = malloc(len);
    memset(a, 'a', len);
    int32_t *want = malloc(len * sizeof *want);
    for (size_t i = 0; i < 25000; i++)
        want[i] = M("aaaa");
    want[25000] = T('a');
    clock_t t0 = clock();
    expect(b, "100001 a's: one word of 25001 tokens", a, len, want, 25001);
    printf("    (%.3f s)\n", (double)(clock() - t0) / CLOCKS_PER_SEC);
    free(a);
    free(want);
}

/* random words from the merges' letters against ref_bpe, then random bytes
 * round trip; 150000 distinct words fill the cache past its size */
static void against_reference(ff_bpe *b)
{
    const char letters[] = "abcehlowxy";
    uint64_t s = 12345;
    int bad = 0;
    for (int k = 0; k < 3000 && bad < 5; k++) {
        unsigned char w[320];
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t m = 1 + (s >> 33) % (k % 100 == 0 ? 300 : 24);
        for (size_t i = 0; i < m; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            w[i] = (unsigned char)letters[(s >> 33) % 10];
        }
        int32_t want[320];
        size_t nwant = ref_bpe(w, m, want), n = 0;
        int rc = ff_bpe_encode(b, (const char *)w, m, toks, &n);
        if (rc != FF_OK || n != nwant || memcmp(toks, want, n * sizeof *want)) {
            CHECK(0, "random word %d '%.*s': %zu tokens, encoder.py's loop %zu", k, (int)m, w, n,
                  nwant);
            bad++;
        }
    }
    if (!bad)
        printf("ok  3000 random words of up to 300 letters equal encoder.py's loop\n");

    int ok = 1;
    for (int k = 0; k < 300; k++) {
        char t[400];
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t m = (s >> 33) % 400, n;
        for (size_t i = 0; i < m; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            t[i] = (char)(s >> 40);
        }
        char *back = NULL;
        size_t blen = 0;
        int rc = ff_bpe_encode(b, t, m, toks, &n);
        rc = rc ? rc : ff_bpe_decode(b, toks, n, &back, &blen);
        if (rc != FF_OK || n > m || blen != m || memcmp(back, t, m)) {
            CHECK(0, "random bytes %d (%zu bytes): round trip fails (rc %d)", k, m, rc);
            ok = 0;
        }
        free(back);
    }
    if (ok)
        printf("ok  300 strings of random bytes: decode(encode(x)) == x, at most a token a byte\n");

    /* " w" + 5 letters of 7: 150000 distinct words (more than the cache's
     * 131072), twice; each word's tokens against ref_bpe */
    const size_t words = 150000;
    char *text = malloc(words * 8);
    size_t len = 0;
    for (size_t i = 0; i < words; i++) {
        size_t v = i;
        text[len++] = ' ';
        for (int j = 0; j < 6; j++, v /= 7)
            text[len++] = letters[v % 7];
    }
    int32_t *all = malloc(len * sizeof *all);
    size_t n1 = 0, n2 = 0;
    int rc1 = ff_bpe_encode(b, text, len, all, &n1);
    int rc2 = ff_bpe_encode(b, text, len, toks, &n2);
    int same = rc1 == FF_OK && rc2 == FF_OK && n1 == n2 && !memcmp(all, toks, n1 * sizeof *all);
    size_t at = 0;
    for (size_t i = 0; same && i < words; i++) {
        int32_t want[8];
        size_t nw = ref_bpe((const unsigned char *)text + 7 * i, 7, want);
        same = at + nw <= n1 && !memcmp(all + at, want, nw * sizeof *want);
        at += nw;
    }
    CHECK(same && at == n1, "150000 words: the cache changes the tokens (%zu, %zu)", n1, n2);
    if (same)
        printf("ok  150000 distinct words twice (past the cache's size): %zu tokens, each word "
               "as encoder.py's loop\n",
               n1);
    free(text);
    free(all);
}

static void llmc_file(ff_bpe *b)
{
    char path[4200], err[512];
    snprintf(path, sizeof path, "%s/gpt2_tokenizer.bin", dir);
    CHECK(ff_bpe_write_llmc(b, path) == FF_OK, "write_llmc: %s", ff_bpe_error(b));
    FILE *f = fopen(path, "rb");
    uint32_t h[256] = {0};
    CHECK(f && fread(h, 4, 256, f) == 256, "read the header");
    if (f)
        fclose(f);
    CHECK(h[0] == 20240328 && h[1] == 2 && h[2] == VOCAB && h[3] == EOT, "llm.c header %u %u %u %u",
          h[0], h[1], h[2], h[3]);
    ff_bpe *d = NULL;
    int rc = ff_bpe_load(path, &d, err, sizeof err);
    CHECK(rc == FF_OK, "load llm.c file: %s", err);
    if (rc != FF_OK)
        return;
    int same = ff_bpe_vocab_size(d) == VOCAB && ff_bpe_eot(d) == EOT && !ff_bpe_can_encode(d);
    for (int32_t id = 0; same && id < VOCAB; id++) {
        size_t l1, l2;
        const unsigned char *t1 = ff_bpe_token(b, id, &l1), *t2 = ff_bpe_token(d, id, &l2);
        same = l1 == l2 && !memcmp(t1, t2, l1);
    }
    CHECK(same, "gpt2_tokenizer.bin read back differs");
    size_t n = 1;
    rc = ff_bpe_encode(d, "hi", 2, toks, &n);
    CHECK(rc == FF_EINVAL && strstr(ff_bpe_error(d), "only decodes"), "encode on a decoder: %d %s",
          rc, ff_bpe_error(d));
    /* a folder with only gpt2_tokenizer.bin decodes */
    ff_bpe *d2 = NULL;
    char sub[4200], path2[4300];
    snprintf(sub, sizeof sub, "%s/llmc", dir);
    snprintf(path2, sizeof path2, "%s/gpt2_tokenizer.bin", sub);
    mkdir(sub, 0700);
    rc = rename(path, path2) == 0 ? ff_bpe_load(sub, &d2, err, sizeof err) : FF_EIO;
    CHECK(rc == FF_OK && ff_bpe_vocab_size(d2) == VOCAB, "a folder with gpt2_tokenizer.bin: %s",
          err);
    int32_t bad[2] = {T('h'), VOCAB + 5};
    char *text = NULL;
    size_t len;
    rc = ff_bpe_decode(d, bad, 2, &text, &len);
    CHECK(rc == FF_EINVAL && strstr(ff_bpe_error(d), "at offset 1") && !text,
          "decode of token %d: %d %s", VOCAB + 5, rc, ff_bpe_error(d));
    if (same && rc == FF_EINVAL)
        printf("ok  gpt2_tokenizer.bin (llm.c, version 2) written and read back: %d tokens, "
               "end of text %d, decodes only; a token outside it refused: %s\n",
               VOCAB, EOT, ff_bpe_error(d));
    unlink(path2);
    rmdir(sub);
    ff_bpe_destroy(d);
    ff_bpe_destroy(d2);
}

/* One malformed vocabulary: encoder.json and vocab.bpe (NULL: absent)
 * must be refused with code and a message containing want. */
static void refused(const char *what, const char *enc, const char *voc, int code, const char *want)
{
    char e[4200], v[4200], err[512] = "";
    snprintf(e, sizeof e, "%s/encoder.json", dir);
    snprintf(v, sizeof v, "%s/vocab.bpe", dir);
    unlink(e);
    unlink(v);
    if (enc)
        write_text("encoder.json", enc);
    if (voc)
        write_text("vocab.bpe", voc);
    static char sentinel;
    ff_bpe *b = (ff_bpe *)(void *)&sentinel; /* must become NULL */
    int rc = ff_bpe_load(dir, &b, err, sizeof err);
    CHECK(rc == code && !b && strstr(err, want), "%s: code %d (want %d), '%s' lacks '%s'", what, rc,
          code, err, want);
    if (rc == code && !b && strstr(err, want))
        printf("ok  refused %-36s %s\n", what, strstr(err, "line") ? strstr(err, "line") : err);
}

static char *replace(const char *s, const char *old, const char *new)
{
    const char *at = strstr(s, old);
    if (!at) {
        fprintf(stderr, "test bug: '%s' not found\n", old);
        exit(2);
    }
    char *out = malloc(strlen(s) + strlen(new) + 1);
    sprintf(out, "%.*s%s%s", (int)(at - s), s, new, at + strlen(old));
    return out;
}

static void malformed(const char *enc, const char *voc)
{
    char err[512], path[4200];
    ff_bpe *b = NULL;
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    unlink(path);
    int rc = ff_bpe_load("/nonexistent/gpt2", &b, err, sizeof err);
    CHECK(rc == FF_EIO && strstr(err, "cannot open the vocabulary"), "missing folder: %s", err);
    rc = ff_bpe_load(dir, &b, err, sizeof err);
    CHECK(rc == FF_EIO && strstr(err, "scripts/setup.sh gpt2-vocab"), "empty folder: %s", err);
    printf("ok  refused a missing folder and an empty one: %s\n", err);
    refused("without vocab.bpe", enc, NULL, FF_EIO, "vocab.bpe");
    char *s;
    char cut[32], eot[32], id[32];
    snprintf(eot, sizeof eot, ": %d}", EOT);
    snprintf(cut, sizeof cut, ": %d", EOT);
    refused("encoder.json cut short", s = replace(enc, eot, cut), voc, FF_ECORRUPT,
            "found the end of the file");
    free(s);
    refused("encoder.json not an object", "[1, 2]", voc, FF_ECORRUPT, "expected '{'");
    refused("a character outside GPT-2's", s = replace(enc, "\"<|endoftext|>\"", "\"\\u4e00\""),
            voc, FF_ECORRUPT, "U+4E00");
    free(s);
    refused("an id given twice", s = replace(enc, eot, ": 3}"), voc, FF_ECORRUPT, "given twice");
    free(s);
    snprintf(id, sizeof id, ": %d}", EOT + 1);
    refused("a gap in the ids", s = replace(enc, eot, id), voc, FF_ECORRUPT, "must have the ids");
    free(s);
    snprintf(id, sizeof id, ": %d.5}", EOT);
    refused("an id that is no integer", s = replace(enc, eot, id), voc, FF_ECORRUPT, "not an id");
    free(s);
    refused("an id beyond int32", s = replace(enc, eot, ": 1e20}"), voc, FF_ECORRUPT, "not an id");
    free(s);
    /* the byte 'A' (id 190) lost: its key becomes "AA" */
    refused("a byte without a token", s = replace(enc, "\"A\": 190", "\"AA\": 190"), voc,
            FF_ECORRUPT, "the byte 0x41");
    free(s);
    refused("a token twice", s = replace(enc, "\"B\": 189", "\"A\": 189"), voc, FF_ECORRUPT,
            "is given twice (ids");
    free(s);
    refused("vocab.bpe without #version", enc, voc + strlen("#version: 0.2\n"), FF_ECORRUPT,
            "line 1");
    refused("a merge of three", enc, s = replace(voc, "h e\n", "h e l\n"), FF_ECORRUPT,
            "line 2: \"h e l\" is not a merge of two tokens");
    free(s);
    refused("a merge of an unknown token", enc, s = replace(voc, "h e\n", "zz e\n"), FF_ECORRUPT,
            "uses \"zz\"");
    free(s);
    refused("a merge into an unknown token", enc, s = replace(voc, "h e\n", "q z\n"), FF_ECORRUPT,
            "makes a token that encoder.json lacks");
    free(s);
    refused("a merge listed twice", enc, s = replace(voc, "l l\n", "l l\nh e\n"), FF_ECORRUPT,
            "listed twice");
    free(s);

    /* llm.c files: wrong magic, cut short, longer, a token of length 0 */
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    uint32_t h[256] = {20240328, 2, 3, 2};
    unsigned char body[] = {1, 'a', 2, 'b', 'c', 1, 'd', 7};
    struct {
        const char *what, *want;
        uint32_t magic, version;
        size_t body_len;
        unsigned char first_len;
    } cases[] = {
        {"llm.c: another magic", "magic is not 20240328", 20240520, 2, 7, 1},
        {"llm.c: version 3", "version 3", 20240328, 3, 7, 1},
        {"llm.c: cut short", "truncated: token 2 of 3", 20240328, 2, 6, 1},
        {"llm.c: longer", "1 bytes more", 20240328, 2, 8, 1},
        {"llm.c: a token of length 0", "token 0 has length 0", 20240328, 2, 7, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        h[0] = cases[i].magic;
        h[1] = cases[i].version;
        body[0] = cases[i].first_len;
        FILE *f = fopen(path, "wb");
        fwrite(h, 4, 256, f);
        fwrite(body, 1, cases[i].body_len, f);
        fclose(f);
        rc = ff_bpe_load(path, &b, err, sizeof err);
        int code = i == 1 ? FF_EUNSUPPORTED : FF_ECORRUPT;
        CHECK(rc == code && !b && strstr(err, cases[i].want), "%s: %d '%s'", cases[i].what, rc,
              err);
        if (rc == code && strstr(err, cases[i].want))
            printf("ok  refused %-36s %s\n", cases[i].what, err);
    }
    unlink(path);
}

/* GPT-2's own files, when scripts/setup.sh gpt2-vocab has fetched them */
static void gpt2_facts(void)
{
    const char *env = getenv("FF_GPT2_DIR"), *home = getenv("HOME"),
               *cache = getenv("XDG_CACHE_HOME");
    char path[4200];
    if (env)
        snprintf(path, sizeof path, "%s", env);
    else if (cache && *cache)
        snprintf(path, sizeof path, "%s/fourfold/gpt2", cache);
    else
        snprintf(path, sizeof path, "%s/.cache/fourfold/gpt2", home ? home : "");
    char enc[4300];
    snprintf(enc, sizeof enc, "%s/encoder.json", path);
    if (access(enc, R_OK) != 0) {
        printf("GPT-2's facts: skipped (no %s: scripts/setup.sh gpt2-vocab fetches it)\n", enc);
        return;
    }
    char err[512];
    ff_bpe *b = NULL;
    int rc = ff_bpe_load(path, &b, err, sizeof err);
    CHECK(rc == FF_OK, "GPT-2's files: %s", err);
    if (rc != FF_OK)
        return;
    CHECK(ff_bpe_vocab_size(b) == 50257 && ff_bpe_eot(b) == 50256, "GPT-2: %d tokens, eot %d",
          (int)ff_bpe_vocab_size(b), (int)ff_bpe_eot(b));
    EXPECT(b, "GPT-2: \" the\" is 262", " the", 262);
    EXPECT(b, "GPT-2: \"Hello world\" is [15496, 995]", "Hello world", 15496, 995);
    /* tiktoken's encode_ordinary and gpt-3-encoder: ordinary text */
    EXPECT(b, "GPT-2: \"<|endoftext|>\" in a text is text", "<|endoftext|>", 27, 91, 437, 1659,
           5239, 91, 29);
    size_t len;
    const unsigned char *t = ff_bpe_token(b, 50256, &len);
    CHECK(len == 13 && !memcmp(t, "<|endoftext|>", 13), "token 50256's bytes");
    printf("ok  GPT-2 (%s): 50257 tokens, <|endoftext|> is 50256\n", path);
    ff_bpe_destroy(b);
}

/* test_bpe --write-vocab DIR: writes the test's vocabulary into DIR (for
 * tests/bpe_cli.sh) */
int main(int argc, char **argv)
{
    ref_init();
    char *enc = encoder_json(), *voc = vocab_bpe();
    if (argc == 3 && !strcmp(argv[1], "--write-vocab")) {
        snprintf(dir, sizeof dir, "%s", argv[2]);
        write_text("encoder.json", enc);
        write_text("vocab.bpe", voc);
        free(enc);
        free(voc);
        return 0;
    }
    snprintf(dir, sizeof dir, "/tmp/ff_bpe_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    write_text("encoder.json", enc);
    write_text("vocab.bpe", voc);
    char err[512];
    ff_bpe *b = NULL;
    int rc = ff_bpe_load(dir, &b, err, sizeof err);
    CHECK(rc == FF_OK, "load the test's vocabulary: %s", err);
    if (rc == FF_OK) {
        CHECK(ff_bpe_vocab_size(b) == VOCAB && ff_bpe_eot(b) == EOT && ff_bpe_can_encode(b),
              "vocabulary %d, eot %d", (int)ff_bpe_vocab_size(b), (int)ff_bpe_eot(b));
        printf("the test's vocabulary: 256 bytes (byte b is token 255 - b), %d merges, "
               "<|endoftext|> %d\n",
               NMERGES, EOT);
        hand_derived(b);
        against_reference(b);
        llmc_file(b);
    }
    ff_bpe_destroy(b);
    malformed(enc, voc);
    gpt2_facts();
    free(enc);
    free(voc);
    char path[4200];
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    unlink(path);
    rmdir(dir);
    if (test_failures)
        printf("test_bpe: %d checks failed\n", test_failures);
    else
        printf("test_bpe: all checks passed\n");
    return test_failures ? 1 : 0;
}
