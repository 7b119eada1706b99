"""TableLong's words in six languages: table and column headers, categorical values and the
question templates. Person names, cities and companies come from ``faker`` in the language's
locale (:data:`LOCALES`); everything else is translated here, one tuple per concept in the
order of :data:`LANGUAGES`.
"""

from __future__ import annotations

LANGUAGES = ("en", "de", "fr", "es", "ja", "zh")
LOCALES = {"en": "en_US", "de": "de_DE", "fr": "fr_FR", "es": "es_ES", "ja": "ja_JP",
           "zh": "zh_CN"}

# concept -> (en, de, fr, es, ja, zh)
WORDS: dict[str, tuple[str, ...]] = {
    # tables
    "departments": ("departments", "Abteilungen", "services", "departamentos", "部署", "部门"),
    "employees": ("employees", "Mitarbeiter", "employés", "empleados", "社員", "员工"),
    "assignments": ("assignments", "Einsätze", "affectations", "asignaciones", "担当", "任务"),
    "customers": ("customers", "Kunden", "clients", "clientes", "顧客", "客户"),
    "products": ("products", "Produkte", "produits", "productos", "製品", "产品"),
    "orders": ("orders", "Bestellungen", "commandes", "pedidos", "注文", "订单"),
    "students": ("students", "Studierende", "étudiants", "estudiantes", "学生", "学生表"),
    "courses": ("courses", "Kurse", "cours", "cursos", "講義", "课程"),
    "enrollments": ("enrollments", "Belegungen", "inscriptions", "matrículas", "履修", "选课"),
    # columns
    "dept_id": ("dept_id", "Abteilungs-ID", "id_service", "id_departamento", "部署ID", "部门编号"),
    "dept_name": ("dept_name", "Abteilungsname", "nom_service", "nombre_departamento", "部署名",
                  "部门名称"),
    "city": ("city", "Stadt", "ville", "ciudad", "都市", "城市"),
    "budget": ("budget", "Budget", "budget", "presupuesto", "予算", "预算"),
    "founded": ("founded", "Gründung", "création", "fundación", "設立日", "成立日期"),
    "emp_id": ("emp_id", "Personalnummer", "id_employé", "id_empleado", "社員ID", "员工编号"),
    "name": ("name", "Name", "nom", "nombre", "氏名", "姓名"),
    "role": ("role", "Funktion", "poste", "puesto", "役職", "职位"),
    "salary": ("salary", "Gehalt", "salaire", "salario", "給与", "工资"),
    "age": ("age", "Alter", "âge", "edad", "年齢", "年龄"),
    "hire_date": ("hire_date", "Eintrittsdatum", "date_embauche", "fecha_contratación",
                  "入社日", "入职日期"),
    "assign_id": ("assign_id", "Einsatz-ID", "id_affectation", "id_asignación", "担当ID",
                  "任务编号"),
    "hours": ("hours", "Stunden", "heures", "horas", "時間", "工时"),
    "start_date": ("start_date", "Startdatum", "date_début", "fecha_inicio", "開始日", "开始日期"),
    "status": ("status", "Status", "statut", "estado", "状態", "状态"),
    "customer_id": ("customer_id", "Kundennummer", "id_client", "id_cliente", "顧客ID",
                    "客户编号"),
    "company": ("company", "Firma", "entreprise", "empresa", "会社", "公司"),
    "signup_date": ("signup_date", "Anmeldedatum", "date_inscription", "fecha_alta", "登録日",
                    "注册日期"),
    "segment": ("segment", "Segment", "segment", "segmento", "区分", "类别"),
    "product_id": ("product_id", "Produktnummer", "id_produit", "id_producto", "製品ID",
                   "产品编号"),
    "category": ("category", "Kategorie", "catégorie", "categoría", "カテゴリ", "品类"),
    "price": ("price", "Preis", "prix", "precio", "価格", "价格"),
    "stock": ("stock", "Bestand", "stock", "existencias", "在庫", "库存"),
    "brand": ("brand", "Marke", "marque", "marca", "ブランド", "品牌"),
    "order_id": ("order_id", "Bestellnummer", "id_commande", "id_pedido", "注文ID", "订单编号"),
    "quantity": ("quantity", "Menge", "quantité", "cantidad", "数量", "数量"),
    "order_date": ("order_date", "Bestelldatum", "date_commande", "fecha_pedido", "注文日",
                   "下单日期"),
    "student_id": ("student_id", "Matrikelnummer", "id_étudiant", "id_estudiante", "学籍番号",
                   "学号"),
    "birth_date": ("birth_date", "Geburtsdatum", "date_naissance", "fecha_nacimiento", "生年月日",
                   "出生日期"),
    "year": ("year", "Studienjahr", "année", "curso", "学年", "年级"),
    "course_id": ("course_id", "Kurs-ID", "id_cours", "id_curso", "講義ID", "课程编号"),
    "subject": ("subject", "Fach", "matière", "asignatura", "科目", "科目"),
    "credits": ("credits", "Leistungspunkte", "crédits", "créditos", "単位", "学分"),
    "teacher": ("teacher", "Lehrkraft", "enseignant", "profesor", "担当教員", "教师"),
    "enrollment_id": ("enrollment_id", "Belegungs-ID", "id_inscription", "id_matrícula",
                      "履修ID", "选课编号"),
    "score": ("score", "Punktzahl", "note", "nota", "得点", "成绩"),
    "term": ("term", "Semester", "semestre", "periodo", "学期", "学期"),
    # aggregate and ordering words (de / fr / es with the article the templates leave out)
    "agg_sum": ("sum", "die Summe", "la somme", "la suma", "合計", "总和"),
    "agg_mean": ("mean", "den Mittelwert", "la moyenne", "la media", "平均", "平均值"),
    "agg_max": ("maximum", "das Maximum", "le maximum", "el máximo", "最大値", "最大值"),
    "agg_min": ("minimum", "das Minimum", "le minimum", "el mínimo", "最小値", "最小值"),
    "agg_count": ("number of rows", "Anzahl der Zeilen", "nombre de lignes", "número de filas",
                  "行数", "行数"),
    "ext_desc": ("highest", "höchsten", "plus grand", "mayor", "最も大きい", "最大"),
    "ext_asc": ("lowest", "niedrigsten", "plus petit", "menor", "最も小さい", "最小"),
    "and": ("and", "und", "et", "y", "かつ", "且"),
}

# categorical value lists: concept -> tuple of value concepts
CATEGORIES: dict[str, tuple[tuple[str, ...], ...]] = {
    "department": (
        ("Sales", "Vertrieb", "Ventes", "Ventas", "営業", "销售"),
        ("Engineering", "Entwicklung", "Ingénierie", "Ingeniería", "技術", "研发"),
        ("Finance", "Finanzen", "Finances", "Finanzas", "経理", "财务"),
        ("Marketing", "Marketing", "Marketing", "Mercadotecnia", "広報", "市场"),
        ("Support", "Kundendienst", "Assistance", "Soporte", "サポート", "客服"),
        ("Legal", "Recht", "Juridique", "Jurídico", "法務", "法务"),
    ),
    "role": (
        ("Manager", "Leitung", "Responsable", "Gerente", "課長", "经理"),
        ("Engineer", "Ingenieur", "Ingénieur", "Ingeniero", "技師", "工程师"),
        ("Analyst", "Analyst", "Analyste", "Analista", "分析担当", "分析师"),
        ("Clerk", "Sachbearbeiter", "Employé", "Administrativo", "事務", "文员"),
        ("Director", "Direktor", "Directeur", "Director", "部長", "总监"),
    ),
    "status": (
        ("active", "aktiv", "actif", "activo", "進行中", "进行中"),
        ("paused", "pausiert", "suspendu", "pausado", "保留", "暂停"),
        ("done", "erledigt", "terminé", "terminado", "完了", "已完成"),
    ),
    "segment": (
        ("retail", "Privat", "particulier", "minorista", "個人", "零售"),
        ("business", "Geschäft", "entreprise", "empresa", "法人", "企业"),
        ("premium", "Premium", "premium", "prémium", "上得意", "高端"),
    ),
    "product_category": (
        ("Books", "Bücher", "Livres", "Libros", "書籍", "图书"),
        ("Toys", "Spielzeug", "Jouets", "Juguetes", "玩具", "玩具"),
        ("Garden", "Garten", "Jardin", "Jardín", "園芸", "园艺"),
        ("Electronics", "Elektronik", "Électronique", "Electrónica", "家電", "电子"),
        ("Food", "Lebensmittel", "Alimentation", "Alimentación", "食品", "食品"),
        ("Clothing", "Kleidung", "Vêtements", "Ropa", "衣料", "服装"),
    ),
    "subject": (
        ("Mathematics", "Mathematik", "Mathématiques", "Matemáticas", "数学", "数学"),
        ("Physics", "Physik", "Physique", "Física", "物理", "物理"),
        ("History", "Geschichte", "Histoire", "Historia", "歴史", "历史"),
        ("Biology", "Biologie", "Biologie", "Biología", "生物", "生物"),
        ("Music", "Musik", "Musique", "Música", "音楽", "音乐"),
        ("Literature", "Literatur", "Littérature", "Literatura", "文学", "文学"),
    ),
    "term": (
        ("spring", "Frühjahr", "printemps", "primavera", "春学期", "春季"),
        ("summer", "Sommer", "été", "verano", "夏学期", "夏季"),
        ("autumn", "Herbst", "automne", "otoño", "秋学期", "秋季"),
    ),
}

# question templates: {table}, {col}, {key}, {val}, {cond}, {agg}, {ext}, {target}, {k} ...
TEMPLATES: dict[str, tuple[str, ...]] = {
    "lookup": (
        "In table {table}, what is the {col} of the row whose {key} is {val}?",
        "Was ist in der Tabelle {table} der Wert von {col} in der Zeile mit {key} = {val}?",
        "Dans la table {table}, quelle est la valeur de {col} de la ligne dont {key} vaut {val} ?",
        "En la tabla {table}, ¿cuál es el valor de {col} de la fila cuyo {key} es {val}?",
        "表 {table} で {key} が {val} の行の {col} は何ですか？",
        "在表 {table} 中，{key} 为 {val} 的那一行的 {col} 是多少？",
    ),
    "count": (
        "How many rows of table {table} satisfy {cond}?",
        "Wie viele Zeilen der Tabelle {table} erfüllen {cond}?",
        "Combien de lignes de la table {table} vérifient {cond} ?",
        "¿Cuántas filas de la tabla {table} cumplen {cond}?",
        "表 {table} で {cond} を満たす行はいくつありますか？",
        "表 {table} 中满足 {cond} 的行有多少？",
    ),
    "aggregate": (
        "What is the {agg} of {col} over the rows of table {table}{where}?",
        "Berechne {agg} von {col} über die Zeilen der Tabelle {table}{where}.",
        "Calculez {agg} de {col} sur les lignes de la table {table}{where}.",
        "Calcula {agg} de {col} en las filas de la tabla {table}{where}.",
        "表 {table}{where} の行における {col} の{agg}は何ですか？",
        "表 {table}{where} 的行中 {col} 的{agg}是多少？",
    ),
    "where": (
        " that satisfy {cond}", " mit {cond}", " qui vérifient {cond}", " que cumplen {cond}",
        " のうち {cond} を満たすもの", " 里满足 {cond}",
    ),
    "argmax": (
        "In table {table}, what is the {target} of the row with the {ext} {col}? "
        "If several rows tie, give all of them.",
        "Was ist in der Tabelle {table} der Wert von {target} in der Zeile mit dem {ext} {col}? "
        "Bei Gleichstand alle nennen.",
        "Dans la table {table}, quelle est la valeur de {target} de la ligne au {col} le {ext} ? "
        "En cas d'égalité, donnez-les toutes.",
        "En la tabla {table}, ¿cuál es el {target} de la fila con el {ext} {col}? "
        "Si hay empate, da todos.",
        "表 {table} で {col} が{ext}行の {target} は何ですか？同点ならすべて答えてください。",
        "在表 {table} 中，{col} {ext}的那一行的 {target} 是什么？若并列，请全部给出。",
    ),
    "topk": (
        "In table {table}, list the {target} of the {k} rows with the {ext} {col}, in that "
        "order (ties: smaller {key} first).",
        "Nenne in der Tabelle {table} {target} der {k} Zeilen mit dem {ext} {col}, in dieser "
        "Reihenfolge (Gleichstand: kleinere {key} zuerst).",
        "Dans la table {table}, donnez {target} des {k} lignes au {col} le {ext}, dans cet ordre "
        "(égalité : plus petit {key} d'abord).",
        "En la tabla {table}, enumera el {target} de las {k} filas con el {ext} {col}, en ese "
        "orden (empate: menor {key} primero).",
        "表 {table} で {col} が{ext}順に {k} 行の {target} を順番に挙げてください"
        "（同点は {key} の小さい順）。",
        "在表 {table} 中，按 {col} {ext}的顺序列出前 {k} 行的 {target}"
        "（并列时 {key} 小者在前）。",
    ),
    "join": (
        "What is the {agg} of {col} over the rows of table {child} whose {fk} refers to a row "
        "of table {parent} that satisfies {cond}?",
        "Berechne {agg} von {col} über die Zeilen der Tabelle {child}, deren {fk} auf eine "
        "Zeile der Tabelle {parent} mit {cond} verweist.",
        "Calculez {agg} de {col} sur les lignes de la table {child} dont {fk} renvoie à "
        "une ligne de la table {parent} qui vérifie {cond}.",
        "Calcula {agg} de {col} en las filas de la tabla {child} cuyo {fk} remite a una "
        "fila de la tabla {parent} que cumple {cond}.",
        "表 {child} の行のうち、{fk} が指す表 {parent} の行が {cond} を満たすものについて、"
        "{col} の{agg}は何ですか？",
        "表 {child} 中 {fk} 指向表 {parent} 里满足 {cond} 的行的那些行，其 {col} 的{agg}是多少？",
    ),
    "join_count": (
        "How many rows of table {child} have a {fk} that refers to a row of table {parent} "
        "satisfying {cond}?",
        "Wie viele Zeilen der Tabelle {child} haben eine {fk}, die auf eine Zeile der Tabelle "
        "{parent} mit {cond} verweist?",
        "Combien de lignes de la table {child} ont un {fk} qui renvoie à une ligne de la table "
        "{parent} vérifiant {cond} ?",
        "¿Cuántas filas de la tabla {child} tienen un {fk} que remite a una fila de la tabla "
        "{parent} que cumple {cond}?",
        "表 {child} の行のうち、{fk} が指す表 {parent} の行が {cond} を満たすものはいくつですか？",
        "表 {child} 中有多少行的 {fk} 指向表 {parent} 里满足 {cond} 的行？",
    ),
    "hop_start": (
        "Take the row of table {table} with the {ext} {col} (ties: smaller {key})",
        "Nimm die Zeile der Tabelle {table} mit dem {ext} {col} (Gleichstand: kleinere {key})",
        "Prenez la ligne de la table {table} au {col} le {ext} (égalité : plus petit {key})",
        "Toma la fila de la tabla {table} con el {ext} {col} (empate: menor {key})",
        "表 {table} で {col} が{ext}行を取り（同点は {key} の小さい方）",
        "取表 {table} 中 {col} {ext}的那一行（并列取 {key} 较小者）",
    ),
    "hop_follow": (
        "follow its {fk} to table {table}", "folge ihrer {fk} zur Tabelle {table}",
        "suivez son {fk} vers la table {table}", "sigue su {fk} hasta la tabla {table}",
        "その {fk} で表 {table} の行に移り", "沿其 {fk} 找到表 {table} 中的行",
    ),
    "hop_end": (
        "what is the {attr} of the row reached?", "welchen Wert hat {attr} in der erreichten "
        "Zeile?", "quelle est la valeur de {attr} de la ligne atteinte ?",
        "¿cuál es el {attr} de la fila alcanzada?", "その行の {attr} は何ですか？",
        "该行的 {attr} 是什么？",
    ),
    "rounded": (
        " Round to 2 decimals.", " Auf 2 Nachkommastellen runden.",
        " Arrondir à 2 décimales.", " Redondea a 2 decimales.", "小数第2位まで答えてください。",
        "保留两位小数。",
    ),
    "instruction": (
        "Answer the question about the tables below. Answer with the value(s) only, "
        "several values separated by commas.",
        "Beantworte die Frage zu den folgenden Tabellen. Antworte nur mit dem Wert bzw. den "
        "Werten, mehrere durch Kommas getrennt.",
        "Répondez à la question sur les tables ci-dessous. Donnez uniquement la ou les valeurs, "
        "séparées par des virgules.",
        "Responde a la pregunta sobre las tablas siguientes. Da solo el valor o los valores, "
        "separados por comas.",
        "以下の表についての質問に答えてください。値だけを答え、複数ある場合はカンマで区切ってください。",
        "请回答关于下列表格的问题。只回答数值或取值，多个值用逗号分隔。",
    ),
    "question": ("Question", "Frage", "Question", "Pregunta", "質問", "问题"),
    "answer": ("Answer", "Antwort", "Réponse", "Respuesta", "回答", "答案"),
}


def _index(language: str) -> int:
    if language not in LANGUAGES:
        raise ValueError(f"tablelong: unknown language {language!r}; known: {LANGUAGES}")
    return LANGUAGES.index(language)


def word(concept: str, language: str) -> str:
    """The ``language`` word of a table, column, aggregate or ordering concept."""
    return WORDS[concept][_index(language)]


def template(name: str, language: str) -> str:
    """The ``language`` question template ``name``."""
    return TEMPLATES[name][_index(language)]


def category_values(category: str, language: str) -> tuple[str, ...]:
    """The translated values of a categorical column kind."""
    i = _index(language)
    return tuple(v[i] for v in CATEGORIES[category])
