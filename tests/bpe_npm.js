// The npm package gpt-3-encoder's own GPT-2 encoder against fourfold's
// tokens (tests/bpe_npm.sh runs it with the machine's node; no network).
//
//   node bpe_npm.js corpus OUT BYTES
//       writes about BYTES of varied text to OUT, the same on every run:
//       letters and digits of many scripts, combining marks, emoji, runs of
//       spaces, tabs and newlines, Unicode spaces, contractions in every
//       case, punctuation and code
//   node bpe_npm.js compare DIR SHARD FILE...
//       encodes each FILE (one document) with DIR/Encoder.js, after the
//       end-of-text token 50256, and compares the stream with SHARD's tokens
//       (fourfold tokenize --bpe DIR --val-fraction 0 FILE...); also decodes
//       fourfold's tokens of each file with the package and compares the text.
//       Prints what it compared; exits 1 at the first difference, naming it.
'use strict';
const fs = require('fs');
const path = require('path');

// mulberry32: a small PRNG, so the corpus is the same on every run
function rng(seed) {
    return () => {
        seed = (seed + 0x6d2b79f5) | 0;
        let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

// Words of several scripts. No U+0085 or U+FEFF: the package reads \s as
// JavaScript does (U+FEFF a space, U+0085 not), GPT-2 (Python's regex,
// tiktoken) and fourfold as Unicode's White_Space (docs/data.md).
const words = [
    // Latin with diacritics, ligatures, decomposed accents (U+0301 is a mark, not a letter)
    'naïve', 'café', 'Zürich', 'façade', 'São', 'Łódź', 'Ærøskøbing', 'straße', 'Œuvre', 'İstanbul',
    'ﬁne', 'cafe\u0301', 'Dvořák', 'Þórr', 'ĳssel', 'Ǆemal',
    // Greek, Cyrillic, Armenian, Georgian
    'Καλημέρα', 'κόσμε', 'ἀρχή', 'λόγος', 'Привет', 'мир', 'съешь', 'ещё', 'Բարեւ', 'გამარჯობა',
    // Arabic, Hebrew (with points), Devanagari (vowel signs are marks), Bengali, Tamil, Thai
    'مرحبا', 'بالعالم', 'العربية', 'שָׁלוֹם', 'עולם', 'नमस्ते', 'दुनिया', 'হ্যালো', 'வணக்கம்', 'สวัสดีชาวโลก',
    // CJK, kana, Hangul
    '你好', '世界', '日本語のテキスト', '東京都', 'カタカナ', '안녕하세요', '세계',
    // emoji: modifiers, ZWJ sequences, flags, keycaps
    '😀', '👍🏽', '👨‍👩‍👧', '🇫🇷', '1️⃣', '❤️', '🤖',
    // digits of several scripts, numbers that are not digits (Nl, No)
    '0123456789', '٠١٢٣٤٥٦٧٨٩', '۰۱۲', '०१२३', '১২৩', '๑๒๓', '１２３', 'Ⅻ', 'ⅷ', '²', '³', '½', '①',
    '3.14159', '1,000,000', '2024-11-28', 'x²', 'H₂O', 'abc123def', '0x1F', '1e-9',
    // contractions in every case, and apostrophes that are not
    "don't", "I'm", "you're", "we've", "they'll", "he'd", "it's", "DON'T", "It'S", "'s", "'S",
    "'t", "'re", "'ve", "'m", "'ll", "'d", "'''", "'re're", "rock'n'roll", "O'Neil", "’s",
    // punctuation and code
    'if (x != y) { return a->b[0]; }', '// TODO: fix #123', '—', '“quotes”', '«guillemets»',
    '‘single’', '…', '¿¡', '<|endoftext|>', '<|endoftext', '...', '!!!', '$$$', '@user', '#tag',
    'https://example.org/a?b=c&d=e', 'a_b_c', 'snake_case', 'CamelCase', 'ALLCAPS', 'x',
];
// separators: runs of spaces, tabs and newlines, Unicode spaces
const seps = [
    ' ', ' ', ' ', ' ', ' ', ' ', '  ', '   ', '    ', '\t', ' \t', '\t\t', '\n', '\n', '\n\n',
    '\n\n\n', ' \n', '\n ', ' \n ', '\r\n', '\v', '\f', '\u00a0', '\u1680', '\u2000', '\u2003',
    '\u200a', '\u2028', '\u2029', '\u202f', '\u205f', '\u3000', '', '', ', ', '. ', '.\n', '-',
];

function corpus(out, bytes) {
    const r = rng(20241128);
    const pick = (a) => a[Math.floor(r() * a.length)];
    const parts = [];
    let n = 0;
    while (n < bytes) {
        let w = pick(words);
        const c = r();
        if (c < 0.1)
            w = w.toUpperCase();
        else if (c < 0.15)
            w = w[0].toUpperCase() + w.slice(1);
        const s = w + pick(seps);
        parts.push(s);
        n += Buffer.byteLength(s);
        if (r() < 0.08) { // end a line
            parts.push('\n');
            n++;
        }
    }
    fs.writeFileSync(out, parts.join(''));
}

// The package's encode() appends every word's tokens with Array.concat (time
// quadratic in a document's length), so a document is given to it in pieces
// cut after a '\n' between two characters that are not white space: GPT-2's
// pattern makes that '\n' a word of its own and starts a new word after it,
// whatever comes before or after, so the pieces' words are the document's.
function pieces(text) {
    const out = [];
    let start = 0;
    const ws = /\s/u;
    for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1)) {
        if (i > 0 && i + 1 < text.length && !ws.test(text[i - 1]) && !ws.test(text[i + 1])) {
            out.push(text.slice(start, i + 1));
            start = i + 1;
        }
    }
    out.push(text.slice(start));
    return out;
}

function compare(dir, shard, files) {
    const enc = require(path.resolve(dir, 'Encoder.js'));
    const buf = fs.readFileSync(shard);
    const n = buf.readInt32LE(8);
    if (buf.readInt32LE(0) !== 20240520 || buf.length !== 1024 + 2 * n)
        throw new Error(`${shard} is not a shard of ${n} tokens`);
    const got = new Uint16Array(buf.buffer.slice(buf.byteOffset + 1024, buf.byteOffset + 1024 + 2 * n));
    let at = 0, bytes = 0;
    for (const f of files) {
        const text = fs.readFileSync(f, 'utf8');
        bytes += Buffer.byteLength(text);
        const want = [50256];
        for (const p of pieces(text))
            for (const t of enc.encode(p))
                want.push(t);
        for (let i = 0; i < want.length; i++) {
            if (at + i >= n || got[at + i] !== want[i]) {
                const ctx = want.slice(Math.max(1, i - 8), i + 8);
                console.log(`FAIL ${f}: token ${i} of the document (${at + i} of the shard) is ` +
                    `${at + i < n ? got[at + i] : 'missing'}, gpt-3-encoder's ${want[i]}; ` +
                    `around it: ${JSON.stringify(enc.decode(ctx))} = [${ctx.join(', ')}]`);
                process.exit(1);
            }
        }
        // the package's decoder gives the text back from fourfold's tokens
        const back = enc.decode(Array.from(got.subarray(at + 1, at + want.length)));
        if (back !== text) {
            console.log(`FAIL ${f}: gpt-3-encoder's decode of fourfold's tokens differs from the text`);
            process.exit(1);
        }
        at += want.length;
    }
    if (at !== n) {
        console.log(`FAIL the shard has ${n} tokens, gpt-3-encoder ${at}`);
        process.exit(1);
    }
    console.log(`ok  ${files.length} documents, ${(bytes / 1e6).toFixed(2)} MB, ${n} tokens: ` +
        `fourfold's tokens equal gpt-3-encoder's exactly, and its decode of them is the text`);
}

const [mode, ...args] = process.argv.slice(2);
if (mode === 'corpus')
    corpus(args[0], Number(args[1]));
else if (mode === 'compare')
    compare(args[0], args[1], args.slice(2));
else {
    console.error('usage: node bpe_npm.js corpus OUT BYTES | compare DIR SHARD FILE...');
    process.exit(2);
}
