/* fourfold tokenize: UTF-8 text files to byte-level token shards, and back.
 *
 * Tokens 0..255 are the bytes of the text, FF_BYTE_EOT (256) precedes every
 * document (GPT-2's and llm.c's convention), so a model trained on these
 * shards has a vocabulary of FF_BYTE_VOCAB = 257 (docs/data.md). With
 * --bpe DIR, GPT-2's tokens instead (include/fourfold/bpe.h), its
 * end-of-text token before every document, and llm.c's gpt2_tokenizer.bin
 * beside the shards.
 *
 * Runs without MPI: main() does not initialise MPI for this command. Started
 * under mpirun anyway, only the process whose launcher rank is 0 works (the
 * others would write the same files). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char help[] =
    "usage: fourfold tokenize --out PREFIX [options] FILE...\n"
    "       fourfold tokenize --decode SHARD [--doc-sep LINE] [--bpe DIR]\n\n"
    "Byte-level tokenizer (no MPI needed; docs/data.md): tokens 0..255 are the bytes of\n"
    "the UTF-8 text, token 256 (end of text) precedes every document; vocabulary 257.\n"
    "Or, with --bpe DIR, GPT-2's tokenizer. Writes llm.c-format shards PREFIX_train.bin\n"
    "and PREFIX_val.bin.\n\n"
    "  --out PREFIX        output prefix (required): PREFIX_train.bin, PREFIX_val.bin\n"
    "  --bpe DIR           GPT-2's byte-level BPE from DIR's encoder.json and vocab.bpe\n"
    "                      (scripts/setup.sh gpt2-vocab puts them in\n"
    "                      ~/.cache/fourfold/gpt2): its end-of-text token (50256)\n"
    "                      precedes every document; also writes llm.c's\n"
    "                      gpt2_tokenizer.bin beside the shards (for decoding). With\n"
    "                      --decode, DIR may hold only gpt2_tokenizer.bin\n"
    "  --val-fraction F    fraction of the documents for validation, 0 <= F < 1 (default\n"
    "                      0.1). Document i (from 0, in input order) goes to val when\n"
    "                      floor((i+1) F) > floor(i F): every (1/F)-th document, spread\n"
    "                      over the corpus. 0: no val file is written. F > 0 that leaves\n"
    "                      val empty (too few documents) is refused.\n"
    "  --doc-sep LINE      a line that separates documents inside a file, e.g. '%' for\n"
    "                      fortune(6) files; the separator lines are not part of any\n"
    "                      document, empty documents are skipped (default: each file is\n"
    "                      one document)\n"
    "  --decode SHARD      write the text of a shard to stdout: bytes (or with --bpe, the\n"
    "                      tokens' bytes) as they are, end of text as nothing, or, with\n"
    "                      --doc-sep LINE, as LINE after every document (a fortune-style\n"
    "                      file round-trips exactly)\n"
    "  --help              this text\n\n"
    "example (the fortunes package; every fortune one document):\n"
    "  fourfold tokenize --doc-sep % --out data/fortunes /usr/share/games/fortunes/fortunes\n"
    "  fourfold tokenize --decode data/fortunes_val.bin --doc-sep % | head\n"
    "  fourfold tokenize --bpe ~/.cache/fourfold/gpt2 --out data/mine notes/*.txt\n";

/* Writes the shard's text to stdout: bytes (or bpe's tokens' bytes) as they
 * are, EOT as nothing, or (with a separator) as the separator line after
 * every document. */
static int decode(const char *path, const char *sep, const ff_bpe *bpe)
{
    uint16_t *tok;
    int64_t n;
    char err[512];
    if (ff_shard_read(path, &tok, &n, err, sizeof err) != FF_OK) {
        cli_error("%s", err);
        return CLI_FAIL;
    }
    int code = CLI_OK, in_doc = 0, last = '\n';
    const int eot = bpe ? (int)ff_bpe_eot(bpe) : FF_BYTE_EOT;
    const int vocab = bpe ? (int)ff_bpe_vocab_size(bpe) : FF_BYTE_VOCAB;
    for (int64_t i = 0; i < n && code == CLI_OK; i++) {
        if (tok[i] >= vocab) {
            if (bpe)
                cli_error("'%s': token %d at offset %lld is outside the vocabulary %s (%d "
                          "tokens)",
                          path, (int)tok[i], (long long)i, ff_bpe_source(bpe), vocab);
            else
                cli_error("'%s': token %d at offset %lld is not a byte-level token (vocabulary "
                          "%d; --bpe DIR for GPT-2's)",
                          path, (int)tok[i], (long long)i, FF_BYTE_VOCAB);
            code = CLI_FAIL;
        } else if (tok[i] == eot) {
            if (sep && in_doc)
                printf("%s%s\n", last == '\n' ? "" : "\n", sep);
            in_doc = 1;
            last = '\n';
        } else if (bpe) {
            size_t len;
            const unsigned char *bytes = ff_bpe_token(bpe, tok[i], &len);
            fwrite(bytes, 1, len, stdout);
            last = len ? bytes[len - 1] : last;
            in_doc = 1;
        } else {
            putchar(tok[i]);
            last = tok[i];
            in_doc = 1;
        }
    }
    if (code == CLI_OK && sep && in_doc)
        printf("%s%s\n", last == '\n' ? "" : "\n", sep);
    free(tok);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error("cannot write the text of '%s' to stdout", path);
        code = CLI_FAIL;
    }
    return code;
}

/* llm.c's decoder file beside the shards of PREFIX: PREFIX's folder's
 * gpt2_tokenizer.bin (llm.c's name; --bpe DIR and llm.c read it). */
static int write_vocab(ff_bpe *bpe, const char *prefix)
{
    const char *slash = strrchr(prefix, '/');
    char path[4200];
    snprintf(path, sizeof path, "%.*s%sgpt2_tokenizer.bin", slash ? (int)(slash - prefix) : 0,
             prefix, slash ? "/" : "");
    if (ff_bpe_write_llmc(bpe, path) != FF_OK) {
        cli_error("%s", ff_bpe_error(bpe));
        return CLI_FAIL;
    }
    cli_print("%s: the vocabulary, %d tokens (llm.c's tokenizer file, for decoding)\n", path,
              (int)ff_bpe_vocab_size(bpe));
    return CLI_OK;
}

int cmd_tokenize(int argc, char **argv)
{
    if (cli_quiet_process())
        return CLI_OK;
    const char *out = NULL, *sep = NULL, *decode_path = NULL, *bpe_dir = NULL, *v;
    double val_fraction = 0.1;
    int ninputs = 0;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) {
        cli_error("out of memory");
        return CLI_FAIL;
    }
    cli_args a;
    cli_args_init(&a, argc, argv);
    int code = CLI_OK;
    while (code == CLI_OK && cli_next(&a)) {
        if (!a.name) {
            inputs[ninputs++] = a.value;
        } else if (cli_is(&a, "help")) {
            cli_print("%s", help);
            free(inputs);
            return CLI_OK;
        } else if (cli_is(&a, "out")) {
            if (!(out = cli_value(&a)))
                code = CLI_USAGE;
        } else if (cli_is(&a, "doc-sep")) {
            if (!(sep = cli_value(&a)))
                code = CLI_USAGE;
        } else if (cli_is(&a, "bpe")) {
            if (!(bpe_dir = cli_value(&a)))
                code = CLI_USAGE;
        } else if (cli_is(&a, "decode")) {
            if (!(decode_path = cli_value(&a)))
                code = CLI_USAGE;
        } else if (cli_is(&a, "val-fraction")) {
            char *end;
            if (!(v = cli_value(&a))) {
                code = CLI_USAGE;
            } else if ((val_fraction = strtod(v, &end)),
                       end == v || *end || !(val_fraction >= 0 && val_fraction < 1)) {
                /* below 1: a train shard with no document is of no use */
                cli_error("--val-fraction %s: expected a number from 0 to below 1", v);
                code = CLI_USAGE;
            }
        } else {
            code = cli_unknown(&a, "tokenize");
        }
    }
    if (code == CLI_OK && decode_path && (out || ninputs)) {
        cli_error("--decode SHARD takes no --out or input files");
        code = CLI_USAGE;
    } else if (code == CLI_OK && !decode_path && !out) {
        cli_error("tokenize needs --out PREFIX (see fourfold tokenize --help)");
        code = CLI_USAGE;
    } else if (code == CLI_OK && !decode_path && !ninputs) {
        cli_error("tokenize needs input files (see fourfold tokenize --help)");
        code = CLI_USAGE;
    } else if (code == CLI_OK && sep && strchr(sep, '\n')) {
        cli_error("--doc-sep: the separator is one line, without a newline");
        code = CLI_USAGE;
    }
    char err[1024] = "";
    ff_bpe *bpe = NULL;
    if (code == CLI_OK && bpe_dir && ff_bpe_load(bpe_dir, &bpe, err, sizeof err) != FF_OK) {
        cli_error("%s", err);
        code = CLI_FAIL;
    }
    if (code != CLI_OK || decode_path) {
        free(inputs);
        if (code == CLI_OK)
            code = decode(decode_path, sep, bpe);
        ff_bpe_destroy(bpe);
        return code;
    }

    ff_tokenize_report rep;
    int rc =
        bpe ? ff_tokenize_files_bpe(inputs, ninputs, sep, val_fraction, out, bpe, &rep, err,
                                    sizeof err)
            : ff_tokenize_files(inputs, ninputs, sep, val_fraction, out, &rep, err, sizeof err);
    if (rc != FF_OK) {
        cli_error("%s", err);
        code = CLI_FAIL;
    } else {
        cli_print_shards(&rep);
    }
    if (code == CLI_OK && bpe)
        code = write_vocab(bpe, out);
    ff_bpe_destroy(bpe);
    free(inputs);
    return code;
}

void cli_print_shards(const ff_tokenize_report *rep)
{
    const ff_shard_stats *s[2] = {&rep->train, &rep->val};
    for (int i = 0; i < 2; i++)
        if (s[i]->path[0])
            cli_print("%s: %lld document%s, %lld tokens, %lld bytes\n", s[i]->path,
                      (long long)s[i]->docs, s[i]->docs == 1 ? "" : "s", (long long)s[i]->tokens,
                      (long long)(FF_SHARD_HEADER_INTS * 4 + 2 * s[i]->tokens));
}
