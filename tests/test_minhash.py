"""MinHash signatures: bit-for-bit datasketch 2.x compatibility, shingling decisions, LSH banding."""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH

from refinery.global_steps import minhash as mh
from refinery.stages.text import split_words

from helpers.texts import multilingual_texts


def datasketch_signature(text: str, num_perm: int, seed: int, size: int) -> np.ndarray:
    m = MinHash(num_perm=num_perm, seed=seed, hashfunc=mh.shingle_hash32)
    m.update_batch(mh.shingles(mh.shingle_words(text), size))
    return m.hashvalues


ALPHABET = [chr(i) for i in range(128)] + ["é", "ß", "İ", "✓", "中", "\u00a0", "\u2028"]
EDGE_TEXTS = [
    "The quick brown fox, jumps over... the lazy_dog 42 times!!",
    "a b c",  # fewer words than the shingle size: one shingle of all of them
    "",
    " \t\n ",
    "Ünïcode wörds ✓ here, and here are some MORE words.",
    "nul\x00inside a word\x00 and\x00\x00 more words here",
    "tabs\tand\x1cfile\x1fseparators\x0bvertical tab words",
]


@pytest.mark.parametrize(("num_perm", "seed"), [(128, 1), (64, 7), (256, 42)])
def test_permutations_are_datasketch_affine32(num_perm, seed):
    ours = mh.MinHasher(num_perm, seed)
    theirs = MinHash(num_perm=num_perm, seed=seed)
    assert theirs.scheme == ours.scheme == "affine32"
    assert np.array_equal(theirs.permutations[0], ours.a)
    assert np.array_equal(theirs.permutations[1], ours.b)


def test_signatures_equal_datasketch_update_on_edge_cases_and_random_text():
    rng = random.Random(3)
    texts = EDGE_TEXTS + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 300))) for _ in range(150)]
    texts += ["".join(rng.choice(ALPHABET[:128]) for _ in range(rng.randint(0, 300))) for _ in range(150)]
    hasher = mh.MinHasher(128, 1, 5)
    sigs = hasher.signatures(texts)
    assert sigs.dtype == np.uint32 and sigs.shape == (len(texts), 128)
    for text, sig in zip(texts, sigs):
        assert np.array_equal(sig, datasketch_signature(text, 128, 1, 5)), repr(text[:60])


@pytest.mark.parametrize("size", [1, 3, 5, 9])
def test_shingle_size_is_honoured(size):
    text = "one two three four five six seven eight nine ten eleven twelve"
    assert np.array_equal(mh.MinHasher(64, 5, size).signatures([text])[0], datasketch_signature(text, 64, 5, size))


def test_long_document_folds_in_chunks_and_equals_datasketch():
    words = [f"w{i % 9973}" for i in range(mh.CHUNK_SHINGLES * 2 + 17)]
    text = " ".join(words)
    hasher = mh.MinHasher(128, 1, 5)
    assert np.array_equal(hasher.signatures([text])[0], datasketch_signature(text, 128, 1, 5))


def test_a_signature_does_not_depend_on_its_batch():
    rng = random.Random(0)
    texts = [" ".join(f"t{rng.randrange(500)}" for _ in range(rng.randrange(0, 3000))) for _ in range(200)]
    hasher = mh.MinHasher(128, 1, 5)
    together = hasher.signatures(texts)
    alone = np.stack([hasher.signatures([t])[0] for t in texts[:20]])
    assert np.array_equal(together[:20], alone)


def test_empty_and_short_documents():
    hasher = mh.MinHasher(32, 1, 5)
    empty, short, short_again, other = hasher.signatures(["", "Two words", "two   WORDS", "three words here"])
    assert (empty == mh.EMPTY_HASH).all()  # no shingles: datasketch's empty MinHash
    assert np.array_equal(short, short_again)  # one shingle of every word, lowercased
    assert not np.array_equal(short, other)
    assert mh.shingles(["a", "b"], 5) == [("a", "b")]
    assert mh.shingles([], 5) == []


def test_words_are_the_heuristics_words_lowercased():
    text = "Hello, World... it's DONE_now"
    assert mh.shingle_words(text) == [w.lower() for w in split_words(text)]
    words = mh.shingle_words(text)
    assert np.array_equal(mh.word_hashes(words), np.array([mh.word_hash64(w) for w in words], dtype=np.uint64))
    fw, counts = mh.document_word_hashes([text, "Ünï ✓", ""])
    assert counts.tolist() == [len(words), 2, 0]
    assert np.array_equal(fw[: len(words)], mh.word_hashes(words))


def test_to_datasketch_round_trip_and_datasketch_lsh_finds_the_pair():
    base = " ".join(f"word{i}" for i in range(300))
    near = base.replace("word150 ", "changed ")
    far = " ".join(f"other{i}" for i in range(300))
    hasher = mh.MinHasher(128, 1, 5)
    sigs = hasher.signatures([base, near, far])
    sketches = [hasher.to_datasketch(s) for s in sigs]
    assert sketches[0].jaccard(sketches[1]) == pytest.approx(float((sigs[0] == sigs[1]).mean()))
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    lsh.insert("base", sketches[0])
    lsh.insert("far", sketches[2])
    assert lsh.query(sketches[1]) == ["base"]


def test_lsh_params_for_the_default_threshold():
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    assert mh.lsh_params(0.8, 128, 0.5, 0.5) == (lsh.b, lsh.r) == (9, 13)
    assert mh.lsh_params(0.8, 128, 0.05, 0.95) == (16, 8)


def test_constructor_rejects_nonsense():
    with pytest.raises(ValueError, match="must be positive"):
        mh.MinHasher(0, 1, 5)


UNICODE_TEXTS = [
    "Der Straße entlang, über Brücken: ÄÖÜ!",
    "日本語のテキストです。東京都、2024年。",
    "中文文本，没有空格；数字１２３和ｆｕｌｌｗｉｄｔｈ。",
    "한국어 문장입니다. 공백이 있습니다!",
    "Ελληνικά κείμενα, με τόνους· και ερωτηματικό;",
    "Română: știință și țară — «ghilimele» …",
    "emoji 😀😀 mixed\u2003em-space\u00a0nbsp\u2028line sep x\u00b2 \u0661\u0662 snake_case_ß",
    "  \t\n ",
    "",
    "plain ascii, in the same batch.",
    "ΟΔΟΣ ΣΟΦΙΑΣ, Σ μόνο· ΤΕΛΟΣ.",  # final sigma: str.lower() reads Σ by its neighbours
    "İSTANBUL'da İ ve ı, Σ\x00Σ",  # U+0130 lowers to two code points; NUL is dropped
]


def test_unicode_path_gives_the_split_words_tokens_and_their_hashes():
    fw, counts = mh.document_word_hashes(UNICODE_TEXTS)
    expected = [mh.shingle_words(t) for t in UNICODE_TEXTS]
    assert counts.tolist() == [len(w) for w in expected]
    assert np.array_equal(fw, np.array([mh.word_hash64(w) for ws in expected for w in ws], dtype=np.uint64))


EVERY_CODE_POINT = np.arange(0x110000, dtype=np.uint32)  # surrogates included


def test_every_code_point_class_matches_the_regex():
    classes = mh._code_point_classes(EVERY_CODE_POINT.tobytes().decode("utf-32-le", "surrogatepass"))
    rng = np.random.default_rng(0)
    sample = np.concatenate((np.arange(0x3000), rng.integers(0x3000, 0x110000, 20_000)))
    for code in sample.tolist():
        if 0xD800 <= code < 0xE000:
            continue
        char = chr(code)
        if not split_words(char):
            expected = mh.WHITESPACE
        else:
            expected = mh.WORD_CHAR if split_words(char + "a") == [char + "a"] else mh.PUNCTUATION
        assert classes[code] == expected, hex(code)


def test_unicode_signatures_match_datasketch_with_the_reference_hash():
    rng = random.Random(3)
    alphabet = "日本語中文한국어ελληνικάștiință" + "abc,.!、。"
    texts = ["".join(rng.choice(alphabet + "  ") for _ in range(rng.randrange(1, 400))) for _ in range(30)]
    hasher = mh.MinHasher(128, 1, 5)
    sigs = hasher.signatures(texts + UNICODE_TEXTS)
    for text, sig in zip(texts + UNICODE_TEXTS, sigs):
        assert np.array_equal(sig, datasketch_signature(text, 128, 1, 5))


def test_code_point_tables_agree_with_str_lower_and_utf8():
    lower = mh._lowercase(EVERY_CODE_POINT)
    length, term = mh._utf8_terms(EVERY_CODE_POINT)
    for code in range(0x110000):
        if 0xD800 <= code < 0xE000:
            continue
        char = chr(code)
        if code not in (0x130, 0x3A3):
            assert chr(lower[code]) == char.lower(), hex(code)
        encoded = char.encode("utf-8")
        h = 0
        for byte in encoded:
            h = (h * mh.WORD_P + byte) & mh.MASK64
        assert (length[code], term[code]) == (len(encoded), h), hex(code)
    # Only NUL, U+0130 and U+03A3 send a text to str.lower(), which leaves none of them behind.
    info, _ = mh._lowered_tables(EVERY_CODE_POINT)
    assert np.flatnonzero(info & mh.STR_LOWER_ONLY).tolist() == [0, 0x130, 0x3A3]
    text = "\u0130\u03a3\x00x\u03a3 \u03a3\u0130"
    words = mh.shingle_words(text)
    assert words == ["i", "\u0307", "σxς", "σi", "\u0307"]  # U+0307, the combining dot, is not \w
    assert mh.document_word_hashes([text])[0].tolist() == [mh.word_hash64(w) for w in words]


def test_code_point_tables_filled_batch_by_batch_give_the_hashes_of_whole_tables():
    # The tables are filled for the code points each batch meets; hashes must not depend on which
    # batches came before (every language of data/multilingual, each batch alone, from empty tables).
    texts = multilingual_texts()
    assert len({t for t in texts if not t.isascii()}) > 500
    mh._tables.cache_clear()
    batch_by_batch = [mh.document_word_hashes(texts[i : i + 50]) for i in range(0, len(texts), 50)]
    assert 1000 < int(mh._tables()[2].sum()) < 0x110000 // 10  # only the code points met
    mh._lowered_tables(EVERY_CODE_POINT)  # whole tables, as before
    for i, (fw, counts) in zip(range(0, len(texts), 50), batch_by_batch):
        whole_fw, whole_counts = mh.document_word_hashes(texts[i : i + 50])
        assert np.array_equal(fw, whole_fw) and np.array_equal(counts, whole_counts)
    expected = [mh.shingle_words(t) for t in texts[:200]]
    assert np.array_equal(mh.document_word_hashes(texts[:200])[0],
                          np.array([mh.word_hash64(w) for ws in expected for w in ws], dtype=np.uint64))


def test_lsh_params_match_datasketchs_optimiser_over_a_grid():
    from datasketch.lsh import _optimal_param

    for num_perm in (16, 64, 128):
        for threshold in (0.3, 0.5, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95):
            for fp, fn in ((0.5, 0.5), (0.05, 0.95), (0.3, 0.7)):
                expected = _optimal_param(threshold, num_perm, fp, fn)
                assert mh.lsh_params(threshold, num_perm, fp, fn) == expected, (threshold, num_perm, fp, fn)
