"""Documentation pages as a crawl extracts them: prose, a fenced code sample with braces, and a list
of command-line options, in English, Chinese and German (tests/test_heuristic_docs.py)."""

CODE_SAMPLE = """```nginx
server {
    listen 8080;
    location / {
        proxy_pass http://127.0.0.1:9000;
    }
}
```"""

DOC_EN = f"""Configuring the proxy
The proxy reads its settings from a file in your home directory when it starts. Each setting has a default, so you only need to write the ones that you want to change.
Create the file and add a server block like the one below, with the port and the address of the service behind the proxy:
{CODE_SAMPLE}
Then restart the service so that the new settings take effect. The log file will show the port that the proxy is listening on.
Options
--port N  the port to listen on (default 8080)
--host NAME  the address to bind to
--verbose  print every request to the log
--config FILE  read the settings from FILE instead of the default
If a setting is given both in the file and on the command line, the command line wins. You can check the result with the status command, which prints the settings that are in use and where each one came from."""

DOC_ZH = f"""配置代理服务器
代理服务器在启动时会从你的主目录中的配置文件读取设置。每个设置都有默认值，所以你只需要写出你想要修改的那些设置。
创建这个文件，并像下面这样加入一个服务器配置块，写明端口和代理后面的服务的地址：
{CODE_SAMPLE}
然后重新启动服务，使新的设置生效。日志文件会显示代理服务器正在监听的端口。
选项
--port N  要监听的端口（默认是 8080）
--host NAME  要绑定的地址
--verbose  把每一个请求都写到日志里
--config FILE  从指定的文件读取设置，而不是默认的文件
如果一个设置同时在文件和命令行中给出，以命令行为准。你可以用状态命令检查结果，它会列出正在使用的设置以及每个设置的来源。"""

DOC_DE = f"""Den Proxy einrichten
Der Proxy liest seine Einstellungen beim Start aus einer Datei in Ihrem Heimatverzeichnis. Jede Einstellung hat einen Standardwert, daher müssen Sie nur die Werte eintragen, die Sie ändern wollen.
Legen Sie die Datei an und fügen Sie einen Server-Block wie den folgenden ein, mit dem Port und der Adresse des Dienstes hinter dem Proxy:
{CODE_SAMPLE}
Starten Sie dann den Dienst neu, damit die neuen Einstellungen wirksam werden. Die Protokolldatei zeigt den Port, auf dem der Proxy lauscht.
Optionen
--port N  der Port, auf dem gelauscht wird (Standard 8080)
--host NAME  die Adresse, an die gebunden wird
--verbose  jede Anfrage in das Protokoll schreiben
--config DATEI  die Einstellungen aus DATEI statt aus der Standarddatei lesen
Wenn eine Einstellung sowohl in der Datei als auch auf der Kommandozeile steht, gilt die Kommandozeile. Sie können das Ergebnis mit dem Befehl status prüfen, der die verwendeten Einstellungen und ihre Herkunft ausgibt."""

DOCS = {"en": DOC_EN, "zh": DOC_ZH, "de": DOC_DE}

# A `{` in prose, not in code: C4's rule still drops this page, and names the line.
PROSE_BRACE_LINE = "Write the name of the user between the braces, as in {user}, and the page fills it in for you."

# A man page's option list as a crawl extracts it: each option alone on its line, its description
# on the next, written without a full stop, as man page translators write them (real pages in
# data/heuristic_docs read so: ru/ls.1, da/ls.1, es/stat.1).
_RU_OPTIONS = [
    ("-a, --all", "копировать также скрытые файлы, имена которых начинаются с точки"),
    ("-b, --banner", "печатать перед каждым файлом страницу с именем владельца"),
    ("-c, --copies=ЧИСЛО", "печатать указанное число копий каждого файла в очереди"),
    ("-d, --dry-run", "показать, какие файлы будут скопированы, но ничего не копировать"),
    ("-f, --force", "заменять файлы, которые уже стоят в очереди, без вопросов"),
    ("-h, --human-readable", "показывать размеры файлов в удобном для человека виде"),
    ("-l, --list", "вывести список файлов в очереди вместе с их владельцами"),
    ("-n, --no-wait", "не ждать, пока принтер освободится, а сразу вернуть управление"),
    ("-p, --priority=ЧИСЛО", "поставить файлы в очередь с указанным приоритетом печати"),
    ("-q, --quiet", "не выводить сообщения о ходе работы и о пропущенных файлах"),
    ("-r, --recursive", "копировать содержимое каталогов вместе со всеми подкаталогами"),
    ("-s, --size", "показывать размер каждого файла перед тем, как он будет скопирован"),
    ("-t, --title=ТЕКСТ", "напечатать указанный текст в заголовке каждой страницы"),
    ("-v, --verbose", "выводить имя каждого файла перед тем, как он будет скопирован"),
]
MANPAGE_RU = "\n".join([
    "ИМЯ",
    "cpq - копирует файлы в очередь печати",
    "ОБЗОР",
    "cpq [ПАРАМЕТР] ФАЙЛ",
    "ОПИСАНИЕ",
    "Копирует каждый ФАЙЛ в очередь печати по умолчанию. Если очередь занята, файлы ждут своей очереди.",
    *(line for option in _RU_OPTIONS for line in option),
    "--help показать эту справку и выйти из программы",
    "--version показать информацию о версии и выйти из программы",
    "АВТОР",
    "Программу написали участники проекта, список которых приведён в файле с исходными текстами.",
])

# A generated table of contents: numbered headings, no sentence and no option list.
TABLE_OF_CONTENTS = "\n".join(
    f"{chapter}.{section}. {title} of the installation and configuration guide"
    for chapter in range(1, 6) for section, title in enumerate(
        ["Overview", "Requirements", "Download", "Package setup", "First start", "Troubleshooting"], 1)
)
