"""The training prompts of the draft head: instruction templates crossed with topics, plus copy-style tasks over
passages of text found on this machine.

The held-out evaluation prompts (assets/prompts/heldout.jsonl) and the bench prompts (assets/prompts/all.jsonl)
use other topics and other wordings; `check_disjoint` refuses a training set that contains any of them, so the
evaluation never measures memorised answers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TOPICS = [
    "volcanoes", "the water cycle", "honey bees", "the Roman Empire", "photosynthesis", "black holes",
    "the printing press", "coral reefs", "electric cars", "the human heart", "chess", "coffee",
    "the moon landing", "recycling", "earthquakes", "the internet", "dinosaurs", "vaccines", "rainforests",
    "the piano", "solar panels", "ancient Egypt", "friendship", "learning a new language", "bicycles",
    "the stock market", "climate change", "bread baking", "the Olympic games", "octopuses", "trains",
    "mountains", "democracy", "time management", "gardening", "the solar system", "robots in factories",
    "healthy breakfast", "the French Revolution", "penguins", "wind energy", "public libraries", "deserts",
    "the immune system", "video games", "rivers", "saving money", "the Great Wall of China", "owls",
    "machine learning", "teamwork", "kites", "tea ceremonies", "glaciers", "the telephone", "jazz music",
    # second list (data v2): wider subjects, still none of the held-out or bench prompts' subjects
    "tornadoes", "the moon", "sharks", "elephants", "the Renaissance", "the Vikings", "ancient Greece",
    "the Industrial Revolution", "world war one", "the Silk Road", "pyramids", "castles", "knights",
    "pirates", "astronauts", "Mars", "comets", "gravity", "electricity", "sound waves", "light and color",
    "the human brain", "sleep", "exercise", "drinking water", "vitamins", "the digestive system", "bones",
    "dogs", "cats", "horses", "butterflies", "ants", "whales", "frogs", "eagles", "wolves", "bats",
    "oak trees", "mushrooms", "cactus plants", "tulips", "potatoes", "rice farming", "chocolate", "cheese",
    "pizza", "soup", "spices", "cooking pasta", "vegetarian food", "fast food", "coffee shops", "markets",
    "money", "banks", "taxes", "small businesses", "advertising", "shopping online", "credit cards",
    "smartphones", "computers", "email", "social media", "passwords", "artificial intelligence",
    "3D printing", "drones", "satellites", "airplanes", "ships", "cars", "bridges", "skyscrapers",
    "roads", "maps", "clocks", "calendars", "the alphabet", "books", "newspapers", "radio", "television",
    "movies", "theater", "painting", "photography", "sculpture", "dance", "guitars", "drums", "opera",
    "football", "basketball", "tennis", "swimming", "running", "yoga", "camping", "fishing", "hiking",
    "travel by train", "hotels", "holidays", "festivals", "weddings", "grandparents", "siblings",
    "neighbors", "pets", "school uniforms", "homework", "exams", "teachers", "universities",
    "reading habits", "writing essays", "public speaking", "kindness", "honesty", "patience",
    "courage", "gratitude", "stress", "happiness", "habits", "goals", "volunteering", "leadership",
    "cities", "villages", "islands", "oceans", "lakes", "caves", "forests", "weather forecasts",
    "snow", "thunderstorms", "the seasons", "rainbows", "the sun", "stars", "nuclear power",
    "oil and gas", "plastic pollution", "water pollution", "endangered animals", "national parks",
    "zoos", "farming", "fishing boats", "factories", "hospitals", "doctors", "nurses", "firefighters",
    "the police", "the post office", "elections", "laws", "human rights", "the United Nations",
]

TEMPLATES = [
    "Write a short paragraph about {t}.",
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Write a short poem about {t}.",
    "Give me a list of five tips related to {t}.",
    "Tell a short story that involves {t}.",
    "What is the history of {t}?",
    "Describe {t} to someone who has never heard of it.",
    "What are the advantages and disadvantages of {t}?",
    "Write a haiku about {t}.",
    "Why is {t} important?",
    "Write a short dialogue between two friends talking about {t}.",
    "Summarize what you know about {t} in three sentences.",
    "Write a few quiz questions about {t}, with answers.",
    # second list (data v2)
    "Explain {t} to a young child.",
    "How does {t} work?",
    "Write a blog post introduction about {t}.",
    "What should a beginner know about {t}?",
    "Write a letter to a friend about {t}.",
    "Compare {t} in the past and today.",
    "What are common myths about {t}?",
    "Write a children's story about {t}.",
    "Give a step by step guide related to {t}.",
    "What would the world be like without {t}?",
    "Write a persuasive paragraph about {t}.",
    "Describe {t} using the five senses.",
    "What questions do people often ask about {t}? Answer two of them.",
    "Write a news report about {t}.",
    "Plan a school lesson about {t}.",
    "Write a short speech about {t}.",
    "List the pros and cons of {t} in a table.",
    "Write a diary entry about a day involving {t}.",
    "What are the main parts of {t}?",
    "Tell me something surprising about {t}.",
]

CODE_TASKS = [
    "Write a Python function that reverses a string.", "Write a Python function that checks if a number is prime.",
    "Write a Python function that returns the largest item of a list.", "Write a Python class for a bank account.",
    "Write a Python function that counts the words in a sentence.", "How do I read a file line by line in Python?",
    "Write a Python function that computes the factorial of n.",
    "Explain what a Python dictionary is, with an example.",
    "Write a SQL query that selects all users older than 30.", "Write a JavaScript function that adds two numbers.",
    "What is the difference between a list and a tuple in Python?", "Write a Python loop that prints 1 to 10.",
    "Explain recursion with a short code example.", "Write a Python function that sorts a list of names.",
    "How do I convert a string to an integer in Python?", "Write a bash command that counts files in a folder.",
]

COPY_TEMPLATES = [
    "Repeat this text exactly:\n\n{p}",
    "Summarize the following text in two sentences:\n\n{p}",
    "Rewrite this text in simpler words:\n\n{p}",
    "Fix any mistakes in this text and return it:\n\n{p}",
    "Turn this text into a bulleted list of its main points:\n\n{p}",
]


def passages(texts: list[str], n: int, gen: torch.Generator, min_chars: int = 200,
             max_chars: int = 600) -> list[str]:
    """n paragraphs of moderate length drawn from the given texts."""
    paras = []
    for text in texts:
        for block in text.split("\n\n"):
            block = " ".join(block.split())
            if min_chars <= len(block) <= max_chars and block.count(" ") > 20:
                paras.append(block)
    if not paras:
        return []
    order = torch.randperm(len(paras), generator=gen).tolist()
    return [paras[i] for i in order[:n]]


def training_prompts(texts: list[str], n_topic: int, n_copy: int, gen: torch.Generator, part: int = 0) -> list[dict]:
    """Chat prompts: n_topic template x topic pairs (without repeats), the code tasks, n_copy copy tasks.
    Part k takes the k-th slice of the same shuffled lists, so parts never repeat a prompt."""
    pairs = [(t, tpl) for t in TOPICS for tpl in TEMPLATES]
    order = torch.randperm(len(pairs), generator=gen).tolist()[part * n_topic:(part + 1) * n_topic]
    out = [{"id": f"topic-{i}", "content": pairs[i][1].format(t=pairs[i][0])} for i in order]
    if part == 0:
        out += [{"id": f"code-{i}", "content": c} for i, c in enumerate(CODE_TASKS)]
    chosen = passages(texts, n_copy * (part + 1), gen)[part * n_copy:]
    for i, p in enumerate(chosen):
        tpl = COPY_TEMPLATES[(i + part) % len(COPY_TEMPLATES)]
        out.append({"id": f"copy-{part}-{i}", "content": tpl.format(p=p)})
    return out


def load_jsonl_contents(path: Path) -> list[str]:
    """The user messages of a prompts file (chat form) or its raw prompts."""
    contents = []
    for line in path.read_text().splitlines():
        if line.strip():
            obj = json.loads(line)
            msgs = obj.get("messages") or [{"role": "user", "content": obj.get("prompt", "")}]
            contents += [m["content"] for m in msgs if m.get("role") == "user"]
    return contents


def check_disjoint(prompts: list[dict], held_out: list[Path]) -> None:
    """Refuse training prompts that appear in an evaluation file."""
    banned = set()
    for path in held_out:
        if path.is_file():
            banned.update(load_jsonl_contents(path))
    clash = [p["content"][:60] for p in prompts if p["content"] in banned]
    if clash:
        raise ValueError(f"training prompts overlap the evaluation prompts: {clash[:3]}")
