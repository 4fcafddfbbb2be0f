"""The quality filters: for every rule, a document it must drop and one it must keep; the
Korean word rules; and the screen that runs language identification before them."""

from __future__ import annotations

import pytest

from bertcore.text import quality
from bertcore.text.clean import Cleaned, Dropped, clean_document
from bertcore.text.config import CorpusConfig
from bertcore.text.quality.c4 import C4
from bertcore.text.quality.config import C4Config, GopherQualityConfig, GopherRepetitionConfig, QualityConfig
from bertcore.text.quality.gopher_quality import GopherQuality
from bertcore.text.quality.gopher_repetition import GopherRepetition, duplicate_ngram_fraction, top_ngram_fraction
from bertcore.text.quality.words import STOP_WORDS
from bertcore.text.reader import RawDocument
from bertcore.text.screen import Screen

GOOD = [
    "The river rises in the hills to the north of the town and flows east to the sea.",
    "Its valley was settled early, and the first mills were built on its banks in the twelfth century.",
    "Today the old mill houses a small museum that tells the story of the people who worked there.",
    "Visitors can walk along the towpath from the station to the museum in about half an hour.",
    "In spring the meadows by the water are full of flowers, and herons fish in the shallows.",
    "The town council has recently restored the bridge that carries the old road across the river.",
]


def page(lines, language="en", paragraphs=None):
    return quality.Page(list(lines), language, paragraphs)


def gopher_quality(lines, language="en", **cfg):
    return GopherQuality(GopherQualityConfig(**cfg)).apply(page(lines, language))


def repetition(lines, paragraphs=None, **cfg):
    return GopherRepetition(GopherRepetitionConfig(**cfg)).apply(page(lines, paragraphs=paragraphs))


def c4(lines, **cfg):
    p = page(lines)
    return C4(C4Config(**cfg)).apply(p), p


def test_good_prose_passes_every_filter():
    p = page(GOOD)
    assert quality.screen(p, quality.build(QualityConfig())) is None
    assert p.lines == GOOD and not p.removed


# -- Gopher quality: one document dropped and one kept per rule ----------------------------------


def test_word_count():
    assert gopher_quality(GOOD[:2]).rule == "word_count"  # 37 words
    assert gopher_quality(GOOD[:3]) is None
    assert gopher_quality(GOOD, max_words=60).rule == "word_count"


def test_mean_word_length():
    short = ["a b c d e f g h i j k l m n o p q r s t u v w x y z to of the and"] * 3
    assert gopher_quality(short, min_words=10).rule == "mean_word_length"
    long = ["Donaudampfschifffahrtsgesellschaftskapitän Rindfleischetikettierungsüberwachungsaufgaben und der die"] * 10
    assert gopher_quality(long, "de", min_words=10).rule == "mean_word_length"
    assert gopher_quality(GOOD) is None


def test_symbol_to_word_ratio():
    tagged = [line + " #news #river #town" for line in GOOD]
    assert gopher_quality(tagged).rule == "symbol_ratio"
    assert gopher_quality([line + " #news" for line in GOOD]) is None  # 6 hashes for ~110 words


def test_bullet_lines():
    bullets = ["\u2022 " + line for line in GOOD]
    assert gopher_quality(bullets).rule == "bullet_lines"
    assert gopher_quality(bullets[:5] + GOOD[5:]) is None  # 5 of 6 lines: 83% <= 90%


def test_ellipsis_lines():
    trailing = [line[:-1] + "..." for line in GOOD]
    assert gopher_quality(trailing[:1] + GOOD[1:], max_symbol_word_ratio=1.0) is None  # 1 of 6 lines: 17%
    assert gopher_quality(trailing[:2] + GOOD[2:], max_symbol_word_ratio=1.0).rule == "ellipsis_lines"  # 33% > 30%


def test_alpha_words():
    numbers = GOOD + [" ".join(str(i) for i in range(40))]
    assert gopher_quality(numbers).rule == "alpha_words"
    assert gopher_quality(GOOD + [" ".join(str(i) for i in range(10))]) is None


def test_stop_words():
    no_stops = ["River rises in hills north; flows east toward sea near harbour, past mills, meadows, bridges."] * 8
    assert gopher_quality(no_stops, max_words=10**6).rule == "stop_words"
    assert gopher_quality(GOOD) is None


def test_korean_word_rules():
    korean = [
        "대한민국은 민주공화국이며 모든 권력은 국민으로부터 나온다.",
        "국가는 법률이 정하는 바에 의하여 재외국민을 보호할 의무를 진다.",
        "모든 국민은 법 앞에 평등하며 누구든지 성별이나 종교 또는 사회적 신분에 의하여 차별을 받지 아니한다.",
        (
            "국민의 자유와 권리는 헌법에 열거되지 아니한 이유로 경시되지 아니하며 "
            "필요한 경우에 한하여 법률로써 제한할 수 있다."
        ),
        "이 법은 공포한 날부터 시행하고 그 밖에 필요한 사항은 대통령령으로 정한다.",
        "국가는 전통문화의 계승과 발전 및 민족문화의 창달에 노력하여야 하며 그 시책을 위한 계획을 세울 수 있다.",
    ]
    # Korean words are short (2-4 syllables) and its particles are attached: the English
    # bounds and stop words would drop real Korean law text
    assert gopher_quality(korean, "ko", min_words=40) is None
    assert gopher_quality(korean, "en", min_words=40).rule in {"mean_word_length", "stop_words"}
    without = [" ".join(w for w in line.split() if w.rstrip(".") not in STOP_WORDS["ko"]) for line in korean]
    assert (
        gopher_quality(korean, "ko", min_words=40, min_stop_words=4) is None
    )  # 수 twice, 및, 또는, 위한, 그 twice, 있다 twice
    assert gopher_quality(without, "ko", min_words=40).rule == "stop_words"


def test_unspaced_languages_skip_word_rules():
    japanese = ["今日は天気がとても良いので、家族と一緒に公園へ散歩に出かけました。"] * 3
    assert gopher_quality(japanese, "ja") is None
    assert gopher_quality(japanese, "en").rule == "word_count"


# -- Gopher repetition -------------------------------------------------------------------------


def test_duplicate_lines():
    assert repetition(GOOD + GOOD[:3]).rule == "duplicate_lines"  # 3 of 9 lines repeat
    assert repetition(GOOD + ["Read more.", "Read more."]) is None  # 1 of 8 lines repeats


def test_duplicate_line_chars():
    long_line = GOOD[0] + " " + GOOD[1] + " " + GOOD[2]
    lines = [
        long_line,
        *GOOD[3:],
        "Short one.",
        "Another short one.",
        "A third short line.",
        "Fourth line here.",
        "Fifth and last.",
        "Sixth line.",
        long_line,
    ]
    result = repetition(lines)
    assert result.rule == "duplicate_line_chars"  # 1 of 12 lines, but 32% of the characters
    assert repetition(lines[:-1]) is None


def test_duplicate_paragraphs():
    paragraphs = ["\n".join(GOOD[:2]), "\n".join(GOOD[2:4]), "\n".join(GOOD[:2])]
    assert repetition(GOOD, paragraphs=paragraphs).rule == "duplicate_paragraphs"
    assert repetition(GOOD, paragraphs=paragraphs[:2]) is None


def test_top_ngram():
    spam = [line + " cheap flights cheap flights cheap flights." for line in GOOD]
    words = " ".join(spam).lower().replace(".", "").replace(",", "").split()
    assert top_ngram_fraction(words, 2) > 0.2
    assert repetition(spam).rule == "top_2gram"
    assert repetition(GOOD) is None


def test_duplicate_ngrams():
    text = " ".join([GOOD[0], GOOD[0].lower(), GOOD[0].lower()])  # the sentence three times in one line
    assert duplicate_ngram_fraction(text.replace(".", "").lower().split(), 5) > 0.4
    assert repetition([text, *GOOD[1:]]).rule == "duplicate_5grams"
    assert repetition(GOOD) is None


# -- C4 ----------------------------------------------------------------------------------------


def test_c4_removes_lines_without_terminal_punctuation_and_short_lines():
    menu = ["Home", "News", "Sport and weather today", "Share this article on social media"]
    result, p = c4(menu + GOOD + ["Next page"])
    assert result is None and p.lines == GOOD
    assert p.removed["c4"] == [*menu, "Next page"]
    assert c4(["Too short."] + GOOD)[1].lines == GOOD
    result, p = c4(menu + GOOD, terminal_punctuation=False, min_line_words=0)
    assert "Home" in p.lines


def test_c4_removes_javascript_and_policy_lines():
    lines = GOOD + [
        "Please enable JavaScript in your browser to see this page.",
        "By continuing you agree to our Terms of Use and privacy policy.",
        "Mit der Nutzung stimmen Sie unserer Datenschutzerklärung zu, bitte lesen Sie sie.",
    ]
    result, p = c4(lines)
    assert result is None and p.lines == GOOD
    result, p = c4(lines, javascript=False, policy=False)
    assert p.lines == lines


def test_c4_drops_lorem_ipsum_and_curly_braces():
    assert c4(GOOD + ["Lorem ipsum dolor sit amet, consectetur adipiscing elit."])[0].rule == "lorem_ipsum"
    assert c4(GOOD + ["Call the function with options {debug: true} to see more."])[0].rule == "curly_braces"
    # a brace in a line that C4 removes anyway (no terminal punctuation) does not drop the page
    assert c4(GOOD + ["if (x) { return y; }"])[0] is None
    assert c4(GOOD + ["Lorem ipsum dolor sit amet, consectetur adipiscing elit."], lorem_ipsum=False)[0] is None


def test_c4_min_sentences():
    assert c4(GOOD[:2])[0].rule == "min_sentences"
    assert c4(GOOD[:3])[0] is None


# -- the screen: language identification, then the filters ------------------------------------------


def test_filters_apply_to_web_records_unless_an_input_says_otherwise():
    cfg = CorpusConfig(inputs=["x"], min_sentences=1, min_chars=0)
    junk = "\n\n".join(["Menu", "Home", "Short text without end"] + GOOD[:1])
    web = RawDocument("u", junk, "plain", 0, url="https://example.org/")
    assert isinstance(clean_document(web, cfg, "en"), Dropped)
    assert isinstance(clean_document(RawDocument("f", junk, "plain", 0), cfg, "en"), Cleaned)
    assert isinstance(clean_document(web, cfg, "en", screen=Screen.of(cfg, quality_filters=False)), Cleaned)
    assert isinstance(
        clean_document(RawDocument("f", junk, "plain", 0), cfg, "en", screen=Screen.of(cfg, True)), Dropped
    )


def test_languages_keep_only_the_chosen_ones():
    cfg = CorpusConfig(inputs=["x"], languages=["de"], min_chars=0)
    english = RawDocument("en", "\n\n".join(GOOD), "plain", 0)
    dropped = clean_document(english, cfg, "en")
    assert dropped == Dropped("language") and dropped.language == "en" and dropped.rule == "en"
    german = RawDocument(
        "de", "Der Fluss entspringt in den Hügeln nördlich der Stadt. Er fließt nach Osten bis zum Meer.", "plain", 0
    )
    kept = clean_document(german, cfg, "en")
    assert isinstance(kept, Cleaned) and kept.language == "de" and kept.language_score >= 0.5
    with pytest.raises(ValueError, match="unknown language code"):
        CorpusConfig(inputs=["x"], languages=["xx"])
