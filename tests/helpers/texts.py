"""Hand-written text that test corpora share: prose every funnel stage keeps."""

# Six sentences of plain English that pass language ID, every Gopher/C4/FineWeb rule and PII.
PROSE = (
    "The harbour town wakes slowly when the fishing boats return with the morning tide. "
    "Traders set out their stalls along the quay and argue about the price of fresh mackerel. "
    "Children run between the nets while their parents count the catch and mend the torn ropes. "
    "By noon the market is loud with voices, and the smell of salt and smoke drifts over the water. "
    "Visitors who come for a single day often stay for a week, charmed by the narrow streets. "
    "In the evening the lamps are lit and the old sailors tell stories that grow longer every year."
)

# Documentation prose with a shell-style brace on one line: C4's curly-bracket rule drops it.
BRACED_DOC = (
    "The configuration file is read once at start, and every key in it overrides the default value.\n"
    "A section opens with a name and a brace, for example server { port 8080; }, and closes with one.\n"
    "Keys that the program does not know are reported with their line number, and the start stops.\n"
    "Comments start with a hash and run to the end of the line, and blank lines are ignored there.\n"
    "The file may include other files, which are read in the order that the include lines give.\n"
    "Every value is a string unless it is written as a number, a boolean, or a list in brackets."
)


def multilingual_texts() -> list[str]:
    """The text of every page of data/multilingual (real pages in ten languages, then the planted
    spam), in file order."""
    import gzip
    import json
    from pathlib import Path

    corpus = Path(__file__).resolve().parents[2] / "data" / "multilingual"
    texts = []
    for name in ("clean", "spam"):
        with gzip.open(corpus / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]
    return texts


# Hand-written prose in scripts and letters the bundled corpora lack (Arabic, Persian, and Latin
# letters outside Latin-1), for the broken-text rule.
WRITTEN = {
    "ar": "اللغة العربية هي إحدى أكثر اللغات انتشارا في العالم، ويتحدث بها أكثر من أربعمائة مليون شخص. "
          "تكتب العربية من اليمين إلى اليسار، ولها ثمانية وعشرون حرفا. "
          "يشرح هذا الدليل طريقة تثبيت النظام وإعداده خطوة بخطوة، ويذكر الأوامر التي يحتاجها المستخدم.",
    "fa": "زبان فارسی یکی از زبان‌های هندواروپایی است و در ایران، افغانستان و تاجیکستان به آن سخن می‌گویند. "
          "این راهنما نحوهٔ نصب و پیکربندی سامانه را گام به گام توضیح می‌دهد و فرمان‌های لازم را نشان می‌دهد.",
    "is": "Þór og Ðóra fóru í ferð norður í land. Veðrið var gott og þau gistu á litlu hóteli við fjörðinn.",
    "tr": "Türkçe öğrenmek isteyen öğrenciler için İstanbul'da yeni bir kurs açıldı. Dersler haftada üç gün.",
    "pl": "Zażółć gęślą jaźń. Pociąg przyjechał punktualnie, a podróżni szybko wysiedli na peron.",
    "vi": "Tiếng Việt là ngôn ngữ chính thức của Việt Nam. Người học thường bắt đầu với bảng chữ cái và dấu.",
    "de": "Der Fuß „Straße“ und die Maße der Öfen: Äpfel, Übungen und Größe sind Wörter mit Umlauten.",
}


def mojibake(text: str, codec: str) -> str:
    """`text` as UTF-8 bytes read as `codec` (latin-1 or cp1252); a byte cp1252 leaves undefined
    (0x81, 0x8D, 0x8F, 0x90, 0x9D) reads as its C1 control, as browsers decode windows-1252."""
    out = []
    for byte in text.encode("utf-8"):
        try:
            out.append(bytes([byte]).decode(codec))
        except UnicodeDecodeError:
            out.append(chr(byte))
    return "".join(out)
