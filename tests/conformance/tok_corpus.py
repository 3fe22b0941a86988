"""tok_corpus.py — text for the tokenizer conformance test: the strings every vocabulary is
checked on (TEST_STRINGS, over 300) and the deterministic training text the test vocabularies
are learned from (training_lines()).

The test strings aim at the places tokenizers differ: every Unicode category the
pre-tokenizers look at (letters, marks, numbers of several kinds, punctuation, symbols,
White_Space and near-whitespace controls), contractions in both cases, runs and mixes of
whitespace at the start, middle and end, digit runs of every length up to 20, code, emoji with
ZWJ sequences and modifiers, scripts without spaces, and special-token text whole, nested,
adjacent and truncated.
"""
import random

SPECIAL_TEXTS = [
    "<s>", "</s>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<|tool|>", "[MASK]",
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>",
    "<bos>", "<eos>", "<pad>", "<mask>", "<start_of_image>",
]

_HAND = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n",
    "\n ",
    "a",
    "Hello",
    "Hello world",
    " Hello world",
    "Hello world ",
    "  Hello  world  ",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "the_quick-brown.fox/jumps\\over|the~lazy^dog",
    "don't", "Don't", "DON'T", "I'LL", "I'll", "we've", "WE'VE", "She'd", "it's", "It'S",
    "they're", "THEY'RE", "I'm", "I'M", "you'd've", "'s", "'", "''", "'''", "' s", "'S'",
    "'Twas", "'TWAS", "O'REILLY", "DON'TS", "'Sup", "'STRAY'", "'dNa", "x'VEy", "'lLama",
    "rock 'n' roll", "the '90s", "O'Neill's", "can't won't shan't",
    "l'été", "aujourd'hui", "dell'arte",
    "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678", "123456789",
    "1234567890", "12345678901", "123456789012", "1234567890123", "12345678901234",
    "123456789012345", "1234567890123456", "12345678901234567", "123456789012345678",
    "1234567890123456789", "12345678901234567890",
    "3.14159", "2.718281828459045", "1,000,000", "1 000 000", "-42", "+7", "0x1F", "1e-9",
    "10%", "$19.99", "€5", "£3.50", "¥1000", "₹250", "2024-01-31", "12:34:56", "v1.2.3",
    "a1b2c3", "abc123def456", "x86_64", "ipv4 192.168.0.1", "phone +1-555-0100",
    "٣٤٥", "١٢٣٤٥٦٧", "۱۲۳", "१२३४", "²³", "x²+y²=z²", "½ ¼ ¾", "Ⅻ Ⅳ", "①②③", "𝟙𝟚𝟛",
    "caf\u00e9", "cafe\u0301", "na\u00efve", "r\u00e9sum\u00e9", "Ångström", "Øresund",
    "Straße", "Größe", "Ærø", "İstanbul", "ıi", "ǅemal", "ﬁnance",
    "Привет, мир!", "Съешь же ещё этих мягких французских булок",
    "Καλημέρα κόσμε", "Ελληνικά 123",
    "שלום עולם", "مرحبا بالعالم", "السلام عليكم ورحمة الله",
    "नमस्ते दुनिया", "हिन्दी में लिखा", "தமிழ்", "ಕನ್ನಡ", "বাংলা ভাষা",
    "สวัสดีชาวโลก", "ພາສາລາວ", "မြန်မာ", "ខ្មែរ",
    "日本語のテキストです。", "東京都渋谷区", "カタカナとひらがな", "ｶﾀｶﾅ",
    "中文分词测试，标点符号！", "我爱北京天安门", "繁體中文字", "𠀀𠀁𠀂",
    "안녕하세요 세계", "한국어 텍스트입니다",
    "Tiếng Việt có dấu", "Türkçe karakterler: çğıöşü", "Polski: zażółć gęślą jaźń",
    "Čeština: příliš žluťoučký kůň", "Română: ăâîșț", "Íslenska: þ ð æ",
    "ሰላም ዓለም", "ᏣᎳᎩ", "ᚠᚢᚦᚨᚱᚲ", "Ꭰ", "ꦗꦮ", "𐌰𐌱𐌲",
    "😀", "😀😃😄", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳\ufe0f\u200d🌈", "🇯🇵🇫🇷",
    "❤️", "I ❤️ NY", "✨ sparkles ✨", "🤖🦾", "emoji🙂inside", "🫠🫨",
    "a\u200bb", "zero\u200dwidth", "bidi\u200eleft\u200fright", "\ufeffBOM",
    "nbsp\u00a0here", "ideographic\u3000space", "thin\u2009space", "en\u2002quad",
    "line\u2028sep", "para\u2029sep", "next\u0085line", "vt\x0bff\x0c", "fs\x1cgs\x1d",
    "nul\x00byte", "bell\x07", "del\x7f", "esc\x1b[31mred\x1b[0m",
    "\ue000private", "\U000f0000", "\uffff", "\U0010ffff", "\U000e0001tag",
    "\U00031350cjkH", "\U0002ebf0cjkI",
    "def f(x):\n    return x ** 2\n",
    "if (a && b) { return; }",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "<div class=\"main\">Hello</div>",
    "SELECT * FROM users WHERE id = 42;",
    "x+=1;y-=2;z*=3",
    "`backticks` and ```fenced```",
    "$HOME/.config",
    "a|b||c",
    "~/path/to/file.txt",
    "C:\\Windows\\System32",
    "https://example.com/path?query=1&b=2#frag",
    "user@example.com",
    "#include <stdio.h>",
    "// comment\n/* block */",
    "λx.x + 1",
    "[1, 2, 3] => {a: 1}",
    "!!!???...",
    "---===+++",
    "((()))[[[]]]{{{}}}",
    "....",
    "…",
    "«quoted» „German“ “English” ‘single’",
    "a—b–c",
    "tab\tseparated\tvalues",
    "multiple\n\nnewlines\n\n\nhere",
    "trailing newline\n",
    "\nleading newline",
    "\t\tindented",
    "    four spaces",
    "mixed \t \n whitespace",
    "a\r\nb\rc\nd",
    " \r\n ",
    "word\n\n\n",
    "   \n\n   ",
    "a  b   c    d     e",
    "end with spaces   ",
    "end with tab\t",
    "!\n",
    "x !\n\n",
    "Mixed 中文 and English and 日本語",
    "русский English ελληνικά",
    "abc日本def",
    "数字123和文字",
    "emoji😀中文",
    "ＡＢＣ１２３",
    "\u2581already\u2581escaped",
    "▁",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<s>Hello</s>",
    "<s> Hello </s>",
    "<unk>",
    "x<unk>y",
    "<<start_of_turn>>",
    "<start_of_tur",
    "start_of_turn>",
    "<start_of_turn><start_of_turn>",
    "<start_of_turn> <end_of_turn>",
    "<|tool|>call()",
    "text <|tool|> text",
    "[MASK] fill [MASK]",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|im_end|><|im_end|>",
    "<|eot_id|> ",
    " <|eot_id|>",
    "<bos><eos>",
    "<mask>",
    "<start_of_image>",
]


def _generated(rng):
    """Combinations the hand list cannot enumerate: words of several scripts glued by random
    separators, digit runs, whitespace runs, and special texts dropped in."""
    words = ["hello", "World", "tokenizer", "don't", "I'LL", "naïve", "Ωmega", "中文", "日本",
             "한국", "привет", "مرحبا", "नमस्ते", "😀", "👨\u200d💻", "42", "3.14", "x_y",
             "foo()", "a+b", "—", "...", "'s", "ÅÄÖ", "ß", "ǅ", "ⅷ", "٣", "½", "\u0301"]
    seps = [" ", "  ", "\t", "\n", "\n\n", "", ",", ", ", ". ", "\r\n", " \n ", "\u3000",
            "\u00a0", "-", "/"]
    out = []
    for _ in range(90):
        n = rng.randint(1, 8)
        parts = []
        for i in range(n):
            if i:
                parts.append(rng.choice(seps))
            r = rng.random()
            if r < 0.1:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
            elif r < 0.18:
                parts.append(rng.choice(SPECIAL_TEXTS))
            else:
                parts.append(rng.choice(words))
        s = "".join(parts)
        if rng.random() < 0.2:
            s = rng.choice(seps) + s
        if rng.random() < 0.2:
            s = s + rng.choice(seps)
        out.append(s)
    return out


def _long():
    para = ("Tokenizers split text into pieces. Long inputs check that merging stays correct "
            "and fast: the priority queue must give the same pieces as the reference, "
            "whatever the length. 数字 1234567 and emoji 😀 keep it honest.\n")
    return [para * 20, "a" * 1000, " " * 300, "ab" * 700, "\n" * 200, "9" * 500,
            "🙂" * 200, "the " * 400]


TEST_STRINGS = _HAND + _generated(random.Random(20240611)) + _long()

# Characters and snippets random_strings() draws from: one or two of each kind that matters.
_POOL = list("aAbBzZ09 '\t\n\r.,!?-_()[]<>|/\\\"`$+=^~%") + [
    "é", "ß", "ǅ", "中", "日", "한", "\u0654", "\u0902", "\u0301", "\u200d", "\u3000", "\u00a0",
    "\u2009", "\x85", "\x0b", "\x0c", "\x1c", "\x00", "٣", "²", "½", "Ⅻ", "😀", "👍🏽", "🇯",
    "\ufeff", "\ue000", "\U0002ebf0", "\u2581", "‘", "—", "…", "«", "€", "©", "°", "±", "\x7f",
    "'s", "'T", "'ll", "'RE"] + SPECIAL_TEXTS


def random_strings(n, seed=12345):
    """n seeded random strings of 0..24 pieces from _POOL: the cases nobody thought to write."""
    rng = random.Random(seed)
    return ["".join(rng.choice(_POOL) for _ in range(rng.randint(0, 24))) for _ in range(n)]


def training_lines(n=20000, seed=7):
    """Deterministic training text: templated sentences over multilingual word lists, code and
    numbers, plus every test string a few times (so that their pieces exist in the vocabulary
    and the merges matter)."""
    rng = random.Random(seed)
    en = ("the of and to in is that for it as was with be by on not he this are or his from at "
          "which but have an they you were her she there been one all we their has would when "
          "if so no will can more other time could into only some than its two may first new "
          "people these also after way well work because through over even most where very "
          "token model text language number system program function return value string "
          "learning training network layer attention memory cache request server batch").split()
    fr = "le la les des une est dans pour pas que qui sur avec été être avoir fait très".split()
    de = "der die das und ist nicht mit sich auch auf für ein eine über schön größer".split()
    es = "el la los las una por con para como más pero sus también año niño señor".split()
    ru = "и в не на я что тот быть с он а весь это как она по но они мы".split()
    zh = "的 一 是 不 了 人 我 在 有 他 这 中 大 来 上 国 个 到 说 们 为 子 和 你 地".split()
    ja = "の に は を た が で て と し れ さ ある いる も する から な こと として".split()
    ko = "이 그 저 것 수 등 들 및 에서 으로 하다 있다 되다 없다 않다".split()
    hi = "का के की है में से और को पर यह एक हैं था".split()
    ar = "في من على إلى أن هذا التي الذي عن مع كان".split()
    langs = [en, en, en, en, fr, de, es, ru, zh, ja, ko, hi, ar]
    code = ["def main():\n    print('hello')\n", "int main(void) { return 0; }\n",
            "for i in range(10):\n\tx += i\n", "const x = {a: 1, b: [2, 3]};\n",
            "if (x != NULL && y->z) {\n    free(x);\n}\n", "SELECT id, name FROM t;\n",
            "<p class=\"x\">text</p>\n", "    return self.value\n"]
    lines = []
    for _ in range(n):
        r = rng.random()
        if r < 0.08:
            lines.append(rng.choice(code))
            continue
        words = rng.choice(langs)
        k = rng.randint(3, 16)
        sep = "" if words in (zh, ja) else " "
        s = sep.join(rng.choice(words) for _ in range(k))
        if r < 0.2:
            s += " " + str(rng.randint(0, 10 ** rng.randint(1, 9)))
        if r < 0.3:
            s = s.capitalize() + rng.choice([".", "!", "?", ",", ":", ";"])
        if r > 0.95:
            s = s.upper()
        lines.append(s)
    for _ in range(3):
        lines.extend(t for t in TEST_STRINGS if t)
    return lines
